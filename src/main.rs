use clap::Parser;

/// jemalloc instead of glibc malloc: a history flow's state holds millions
/// of small allocations, and glibc spent ~40% of its apply in malloc, free
/// and chunk consolidation; jemalloc applies it 1.6x faster at the same
/// peak RSS (docs/dev/benchmarks.md).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The most threads the runtime runs blocking work on at once; more waits
/// its turn (tokio's default is 512).
const BLOCKING_THREADS: usize = 64;

fn main() -> std::process::ExitCode {
    let cli = autocdc::tools::cli::Cli::parse();
    // Structured lines on stderr (`AUTOCDC_LOG`: error, warn, info (the
    // default), debug, trace).
    let level = std::env::var("AUTOCDC_LOG")
        .ok()
        .and_then(|l| l.parse::<tracing::Level>().ok())
        .unwrap_or(tracing::Level::INFO);
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(level)
        .with_target(false)
        .init();
    // The blocking pool (file reads and writes, fsyncs, body decoding) is
    // bounded, and its threads stay a minute after a burst instead of tokio's
    // 10 s: a service committing every few hundred ms reuses them rather than
    // spawning and joining threads all day.
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(BLOCKING_THREADS)
        .thread_keep_alive(std::time::Duration::from_secs(60))
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    match rt.block_on(autocdc::tools::cli::run(cli)) {
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
