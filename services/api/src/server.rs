//! The listener: connections capped, requests and bodies read within a time, writes that
//! stall cut off, TLS handshakes bounded.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use ksched_runtime::error::Result;
use tracing::{debug, info, warn};

use crate::Api;
use crate::routes::router;

/// Serves the API on `listen` until `shutdown` resolves, over TLS when `tls` is given.
///
/// Hostile clients get little: at most `http.max_connections` connections at once (the
/// next ones are told 503 and closed), and a connection that does not send a request's
/// headers within `http.request_read_timeout_ms` of connecting or of its last response, a
/// body within as long after its headers (`read_body_in_time`), or does not read what it
/// is sent within as long (`WriteDeadline`), is closed. A TLS handshake has its own
/// timeout.
pub async fn serve(
    listen: &str,
    tls: Option<Arc<rustls::ServerConfig>>,
    api: Arc<Api>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    crate::console::start_sampler(api.clone());
    let listener =
        tokio::net::TcpListener::bind(listen)
            .await
            .map_err(ksched_runtime::error::io(format!(
                "binding the HTTP API to {listen}"
            )))?;
    match &tls {
        Some(_) => info!(listen, "HTTP API listening over TLS"),
        None => info!(listen, "HTTP API listening"),
    }
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let read_timeout = api.read_timeout;
    let slots = Arc::new(tokio::sync::Semaphore::new(api.max_connections));
    let app = router(api);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: pause rather than spin.
                    warn!(error = %e, "HTTP API cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let (acceptor, app) = (acceptor.clone(), app.clone());
        // Every connection is accepted, so the listen backlog never fills: past the cap, a
        // plain connection is told 503 and closed at once.
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            if acceptor.is_none() {
                tokio::spawn(refuse_connection(stream));
            }
            continue;
        };
        tokio::spawn(async move {
            let _slot = slot;
            let stream = WriteDeadline::new(stream, read_timeout);
            let Some(acceptor) = acceptor else {
                return serve_connection(stream, app, read_timeout, peer).await;
            };
            match tokio::time::timeout(crate::tls::HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await
            {
                Ok(Ok(s)) => serve_connection(s, app, read_timeout, peer).await,
                Ok(Err(e)) => debug!(%peer, error = %e, "TLS handshake refused"),
                Err(_) => debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
}

/// A connection past `http.max_connections`: 503, closed.
async fn refuse_connection(mut stream: tokio::net::TcpStream) {
    use tokio::io::AsyncWriteExt;
    let answer = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: 57\r\nConnection: close\r\n\r\n{\"error\": \"too many connections (http.max_connections)\"}\n";
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(answer)).await;
}

/// A connection whose writes may not stall: a client that stops reading (a pipelined flood
/// it never reads, a server-sent event stream it left) is cut off once a write has waited
/// this long, instead of holding its connection for ever.
struct WriteDeadline<S> {
    inner: S,
    limit: Duration,
    stalled: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl<S> WriteDeadline<S> {
    pub(super) fn new(inner: S, limit: Duration) -> WriteDeadline<S> {
        WriteDeadline {
            inner,
            limit,
            stalled: None,
        }
    }

    /// After a write that returned `poll`: arms the deadline while it waits, checks it.
    fn watch<T>(
        &mut self,
        cx: &mut std::task::Context<'_>,
        poll: std::task::Poll<std::io::Result<T>>,
    ) -> std::task::Poll<std::io::Result<T>> {
        use std::future::Future;
        if poll.is_ready() {
            self.stalled = None;
            return poll;
        }
        let limit = self.limit;
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match sleep.as_mut().poll(cx) {
            std::task::Poll::Ready(()) => std::task::Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client did not read its answer in time",
            ))),
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for WriteDeadline<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for WriteDeadline<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let poll = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        self.watch(cx, poll)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let poll = std::pin::Pin::new(&mut self.inner).poll_flush(cx);
        self.watch(cx, poll)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// One HTTP/1.1 connection, with the header read timeout.
async fn serve_connection<S>(
    stream: S,
    app: Router,
    read_timeout: Duration,
    peer: std::net::SocketAddr,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper_util::service::TowerToHyperService::new(app);
    if let Err(e) = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(read_timeout)
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
        .await
    {
        debug!(%peer, error = %e, "HTTP API connection ended");
    }
}
