use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = autocdc::cli::Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    match rt.block_on(autocdc::cli::run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::from(match &e {
                autocdc::Error::Config(_) | autocdc::Error::Definition { .. } => 2,
                autocdc::Error::Batch { .. } | autocdc::Error::Input { .. } => 3,
                _ => 1,
            })
        }
    }
}
