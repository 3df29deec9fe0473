//! `hyper-proxy --upstream ADDR`: the plainest reverse proxy hyper makes,
//! as a reference for the edge benchmark. It shows what a proxy built on
//! hyper costs before any of the edge's own work (host routing, access,
//! session lookups, connection bounds) is added.
//!
//! It is what hyper's documentation leads to: a multi-threaded tokio
//! runtime, a task per client connection serving HTTP/1.1, and one
//! upstream HTTP/1.1 connection per client connection, opened at its first
//! request and driven by a task of its own. A request's hop-by-hop headers
//! are dropped and `X-Forwarded-For`, `X-Forwarded-Proto`,
//! `X-Forwarded-Host` and `Via` are set, as the edge and the benchmark's
//! nginx set them; the response's hop-by-hop headers are dropped too.
//! Bodies stream both ways. No upgrades: the benchmark uses it only for
//! small requests.
//!
//! It listens on 127.0.0.1 on a free port, prints `listening on
//! http://ADDR`, and serves until it is killed.

#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::sync::Arc;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::{Either, Empty};
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;

const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
}

type Upstream = Arc<Mutex<Option<SendRequest<Incoming>>>>;
type Answer = Response<Either<Incoming, Empty<Bytes>>>;

fn bad_gateway() -> Answer {
    let mut response = Response::new(Either::Right(Empty::new()));
    *response.status_mut() = StatusCode::BAD_GATEWAY;
    response
}

async fn forward(
    upstream_addr: SocketAddr,
    client: SocketAddr,
    upstream: Upstream,
    request: Request<Incoming>,
) -> Result<Answer, hyper::Error> {
    let (mut parts, body) = request.into_parts();
    let host = parts.headers.get(header::HOST).cloned();
    strip_hop_by_hop(&mut parts.headers);
    if let Some(host) = host {
        parts.headers.insert("x-forwarded-host", host);
    }
    if let Ok(value) = HeaderValue::from_str(&client.ip().to_string()) {
        parts.headers.insert("x-forwarded-for", value);
    }
    parts
        .headers
        .insert("x-forwarded-proto", HeaderValue::from_static("http"));
    parts
        .headers
        .insert(header::VIA, HeaderValue::from_static("1.1 telo-runner"));
    parts.version = http::Version::HTTP_11;
    let request = Request::from_parts(parts, body);

    // One request at a time comes on a client connection, so its upstream
    // connection is never waited on by another.
    let mut held = upstream.lock().await;
    if held.as_ref().is_none_or(SendRequest::is_closed) {
        let Ok(stream) = TcpStream::connect(upstream_addr).await else {
            return Ok(bad_gateway());
        };
        let _ = stream.set_nodelay(true);
        let (sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        *held = Some(sender);
    }
    let Some(sender) = held.as_mut() else {
        return Ok(bad_gateway());
    };
    if sender.ready().await.is_err() {
        *held = None;
        return Ok(bad_gateway());
    }
    let answer = sender.send_request(request);
    drop(held);
    match answer.await {
        Ok(response) => {
            let (mut parts, body) = response.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            Ok(Response::from_parts(parts, Either::Left(body)))
        }
        Err(_) => Ok(bad_gateway()),
    }
}

async fn serve(listener: TcpListener, upstream_addr: SocketAddr) -> ! {
    loop {
        let (stream, client) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(_) => {
                // Out of descriptors, most likely: give the open ones a
                // moment to close rather than spin.
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let upstream: Upstream = Arc::default();
            let service = service_fn(move |request| {
                forward(upstream_addr, client, upstream.clone(), request)
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let upstream_addr: SocketAddr = match (args.next().as_deref(), args.next()) {
        (Some("--upstream"), Some(addr)) => addr.parse()?,
        _ => anyhow::bail!("usage: hyper-proxy --upstream ADDR"),
    };
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    println!("listening on http://{}", listener.local_addr()?);
    serve(listener, upstream_addr).await
}
