//! `autocdc serve` in a child process, as `bench-serve` and `soak` run it:
//! this binary started on a configuration file with its output in a log
//! file, waited for until `/readyz` answers, stopped by SIGTERM (it commits
//! what is pending and exits 0), and killed if dropped while it runs.

use std::path::Path;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// How long the server may take to become ready, and to stop.
const PATIENCE: Duration = Duration::from_secs(60);

pub struct ServeChild {
    child: Child,
}

impl ServeChild {
    /// Starts `autocdc serve --config <config>` (stdout and stderr to `log`)
    /// and waits until `<base>/readyz` answers 200, or fails when the
    /// process exits first or PATIENCE runs out.
    pub async fn start(
        config: &Path,
        log: &Path,
        client: &reqwest::Client,
        base: &str,
    ) -> Result<ServeChild> {
        let out = std::fs::File::create(log)?;
        let child = Command::new(std::env::current_exe()?)
            .arg("serve")
            .arg("--config")
            .arg(config)
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()?;
        let mut server = ServeChild { child };
        let deadline = Instant::now() + PATIENCE;
        while Instant::now() < deadline {
            if let Some(status) = server.try_wait()? {
                return Err(Error::Unavailable(format!(
                    "autocdc serve exited at start: {status} (its log: {})",
                    log.display()
                )));
            }
            if let Ok(r) = client.get(format!("{base}/readyz")).send().await
                && r.status().is_success()
            {
                return Ok(server);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(Error::Unavailable(format!(
            "autocdc serve was not ready within {} s (its log: {})",
            PATIENCE.as_secs(),
            log.display()
        )))
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The exit status if the server has exited.
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        Ok(self.child.try_wait()?)
    }

    /// SIGTERM, then up to PATIENCE for the server to commit and exit; killed
    /// (and an error) past it.
    pub fn stop(&mut self) -> Result<ExitStatus> {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + PATIENCE;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        Err(Error::Unavailable(format!(
            "autocdc serve did not stop within {} s of SIGTERM",
            PATIENCE.as_secs()
        )))
    }
}

impl Drop for ServeChild {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
