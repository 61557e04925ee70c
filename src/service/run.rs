//! `autocdc serve`'s process: the ingest log chosen (local or NATS JetStream,
//! with its leases and shared definitions), the listener started, the flows
//! recovered, the lease loop and the definitions follower run, and the
//! stop that commits what is pending.

use std::sync::Arc;

use crate::error::Error;
use crate::service::Service;
use crate::service::http::listener::{ConnLimits, accept_loop};
use crate::service::http::router;

/// A started service: its address, the service and the HTTP task.
pub struct Running {
    pub addr: std::net::SocketAddr,
    pub service: Arc<Service>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    stop: tokio::sync::watch::Sender<bool>,
    /// On a shared log: the task that keeps the flows' leases.
    lease_task: Option<tokio::task::JoinHandle<()>>,
    /// Applies the definitions other instances write (ends at once on the
    /// local store).
    definitions_task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Stops accepting, waits for in-flight requests, commits what is pending.
    pub async fn stop(self) -> crate::Result<()> {
        self.stop.send_replace(true);
        let res = self.server.await;
        if let Some(t) = self.lease_task {
            let _ = t.await;
        }
        let _ = self.definitions_task.await;
        self.service.shutdown().await;
        match res {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.into()),
            Err(e) => Err(Error::Unavailable(e.to_string())),
        }
    }

    /// Waits for SIGTERM / SIGINT, then stops.
    pub async fn until_signal(self) -> crate::Result<()> {
        shutdown_signal().await;
        tracing::info!("stopping: committing what is pending");
        self.stop().await
    }
}

/// Binds `server.listen`, serves HTTP, and recovers every flow from its log;
/// returns once the service is ready.
pub async fn start(
    config: crate::config::Config,
    faults: Arc<crate::fault::Faults>,
) -> crate::Result<Running> {
    match &config.ingest {
        crate::config::IngestConfig::Local => {
            let logs = Arc::new(crate::service::wal::LocalLogs::new(
                std::path::Path::new(&config.server.data_dir).join("flows"),
                faults.clone(),
            ));
            start_inner(config, faults, logs, None).await
        }
        crate::config::IngestConfig::Nats(nats) => {
            let logs = crate::service::nats_log::NatsLogs::connect(
                nats,
                config.server.idempotency_window()?,
            )
            .await?;
            let leases = Arc::new(logs.leases().await?);
            let definitions = Arc::new(logs.definitions().await?);
            start_inner(config, faults, Arc::new(logs), Some((leases, definitions))).await
        }
    }
}

/// `start` with each flow's ingest log opened by `logs` (the seam for logs
/// other than the local one).
pub async fn start_with_logs(
    config: crate::config::Config,
    faults: Arc<crate::fault::Faults>,
    logs: Arc<dyn crate::service::wal::LogFactory>,
) -> crate::Result<Running> {
    start_inner(config, faults, logs, None).await
}

async fn start_inner(
    config: crate::config::Config,
    faults: Arc<crate::fault::Faults>,
    logs: Arc<dyn crate::service::wal::LogFactory>,
    shared: Option<(
        Arc<crate::service::lease::Leases>,
        Arc<crate::service::definitions::NatsDefinitions>,
    )>,
) -> crate::Result<Running> {
    let catalog = crate::table::catalog::open(&config.catalog, faults.clone())?;
    let flows = config.flows()?;
    config.maintenance.schedule()?;
    let mut server = config.server.clone();
    server.maintenance = config.maintenance.clone();
    let service = Service::with_logs(server, catalog, faults, logs)?;
    let listener = tokio::net::TcpListener::bind(&config.server.listen)
        .await
        .map_err(|e| Error::Config(format!("server.listen = {}: {e}", config.server.listen)))?;
    let addr = listener.local_addr()?;
    let app = router(service.clone());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let limits = ConnLimits {
        max_connections: config.server.max_connections.max(1),
        header_read_timeout: config.server.header_read_timeout()?,
        shutdown_grace: config.server.shutdown_grace()?,
    };
    let lease_task = shared.map(|(l, d)| {
        service.set_leases(l.clone());
        service.set_definitions(d);
        tokio::spawn(lease_loop(service.clone(), l, stopped.clone()))
    });
    let definitions_stop = stopped.clone();
    let server = tokio::spawn(accept_loop(listener, app, service.clone(), limits, stopped));
    tracing::info!(
        data_dir = %config.server.data_dir,
        flows = flows.len(),
        "listening on http://{addr}; recovering the flows"
    );
    if let Err(e) = service.start(flows).await {
        server.abort();
        if let Some(t) = lease_task {
            t.abort();
        }
        return Err(e);
    }
    let definitions_task = tokio::spawn(service.clone().follow_definitions(definitions_stop));
    tracing::info!("ready");
    Ok(Running {
        addr,
        service,
        server,
        stop,
        lease_task,
        definitions_task,
    })
}

/// On a shared log: the leases kept, and other instances' requests for a
/// commit of a flow held here answered, until `stop`.
async fn lease_loop(
    service: Arc<Service>,
    leases: Arc<crate::service::lease::Leases>,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    tokio::join!(
        keep_leases(service.clone(), leases.clone(), stop.clone()),
        answer_commit_requests(service, leases, stop),
    );
}

/// Commits a flow held here at once when another instance asks: a client
/// waits there on `/commit` or `?wait=commit`, which would otherwise wait
/// for this instance's next `commit_interval` tick.
async fn answer_commit_requests(
    service: Arc<Service>,
    leases: Arc<crate::service::lease::Leases>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    use futures::StreamExt;
    let mut requests = loop {
        match leases.commit_requests().await {
            Ok(s) => break s,
            Err(e) => {
                tracing::warn!(error = %e, "commit_requests_unavailable");
                tokio::select! {
                    _ = tokio::time::sleep(leases.period()) => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
        }
    };
    loop {
        let message = tokio::select! {
            m = requests.next() => m,
            _ = stop.wait_for(|s| *s) => return,
        };
        // None: the connection is gone for good (the client was dropped).
        let Some(message) = message else { return };
        let Some((flow, offset)) = crate::service::lease::Leases::commit_request(&message) else {
            continue;
        };
        if let Ok(rt) = service.flow(flow)
            && rt.commits_here().is_some()
        {
            rt.commit_through(offset);
        }
    }
}

/// Renews, takes and gives back the flows' leases every quarter of their
/// TTL, and wakes a flow's committer when its lease changed hands.
async fn keep_leases(
    service: Arc<Service>,
    leases: Arc<crate::service::lease::Leases>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    // The flows are recovered first: the first round then covers them all.
    while !service.is_ready() {
        tokio::select! {
            _ = tokio::time::sleep(std::time::Duration::from_millis(20)) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
    loop {
        let flows = service.flows();
        let names: Vec<String> = flows.iter().map(|rt| rt.flow.name.clone()).collect();
        let before: Vec<Option<u64>> = names.iter().map(|n| leases.holds(n)).collect();
        tokio::select! {
            _ = leases.tick(&names) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        for ((rt, name), was) in flows.iter().zip(&names).zip(before) {
            if leases.holds(name) != was {
                rt.wake();
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(leases.period()) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// `autocdc serve`: runs until SIGTERM or SIGINT, then commits what is pending.
pub async fn serve(
    config: crate::config::Config,
    faults: Arc<crate::fault::Faults>,
) -> crate::Result<()> {
    start(config, faults).await?.until_signal().await
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
