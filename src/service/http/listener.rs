//! The accept loop: hyper's HTTP/1.1 server with what `axum::serve` lacks
//! for untrusted clients (a connection cap, a header read timeout, a bounded
//! shutdown grace).

use std::sync::Arc;

use axum::Router;

use crate::service::Service;
use crate::service::traffic::Connections;

pub(crate) struct ConnLimits {
    pub(crate) max_connections: usize,
    pub(crate) header_read_timeout: std::time::Duration,
    pub(crate) shutdown_grace: std::time::Duration,
}

/// Accepts connections and serves each with hyper's HTTP/1.1 server, with
/// what `axum::serve` lacks for untrusted clients:
/// - a client must send each request head within `header_read_timeout`
///   (an idle keep-alive connection is closed after it, too);
/// - at most `max_connections` are open; one more is closed at once and
///   counted, so idle sockets cannot use up the process's files;
/// - at stop, connections get `shutdown_grace` to finish what they are
///   doing; whatever still holds one open (a half-sent head) is then cut,
///   so shutdown, and the commit of what is pending, cannot be held up.
pub(crate) async fn accept_loop(
    listener: tokio::net::TcpListener,
    app: Router,
    service: Arc<Service>,
    limits: ConnLimits,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    use std::sync::atomic::Ordering::Relaxed;
    let permits = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let (closing, closing_rx) = tokio::sync::watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
            accepted = listener.accept() => accepted,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                // Out of files or similar: do not spin; the connections
                // that end free what is needed.
                tracing::warn!(error = %e, "accept_failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            service.connections.refused.fetch_add(1, Relaxed);
            drop(tcp);
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let svc = hyper_util::service::TowerToHyperService::new(app.clone());
        let mut closing = closing_rx.clone();
        let open = service.clone();
        let timeout = limits.header_read_timeout;
        tasks.spawn(async move {
            let _permit = permit;
            open.connections.open.fetch_add(1, Relaxed);
            let _open = OpenConnection(&open.connections);
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(timeout);
            let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(tcp), svc);
            let mut conn = std::pin::pin!(conn);
            let closed = tokio::select! {
                _ = conn.as_mut() => true,
                _ = closing.wait_for(|c| *c) => false,
            };
            if !closed {
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
            }
        });
    }
    drop(listener);
    let _ = closing.send(true);
    let drained = tokio::time::timeout(limits.shutdown_grace, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            open = tasks.len(),
            "connections_cut: still open after server.shutdown_grace"
        );
        tasks.shutdown().await;
    }
    Ok(())
}

pub(crate) struct OpenConnection<'a>(&'a Connections);

impl Drop for OpenConnection<'_> {
    fn drop(&mut self) {
        self.0
            .open
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}
