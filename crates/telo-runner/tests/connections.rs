//! What anonymous connections may cost the service: every request's header
//! block has a deadline (idle keep-alive connections included), header
//! blocks and bodies are bounded in size and time, at the connection limit
//! the oldest connection that has sent nothing is shed for a new one (and
//! with none left a client gets a clear 503), one client address holds at
//! most its share of connections (behind a trusted proxy, the address it
//! forwards), and the open-file limit is raised at boot — so thousands of
//! idle and slow clients leave the probes and real requests answering in
//! bounded memory.
#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{Backend, Runner, RunnerProcess};
use reqwest::StatusCode;
use serde_json::{Value, json};
use test_support::bundle::start_body;
use test_support::ws;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// Bound on anything a test waits for.
const WAIT: Duration = Duration::from_secs(30);

fn addr_of(base: &str) -> String {
    base.trim_start_matches("http://").to_owned()
}

/// Reads until the server closes the connection; returns what it sent.
async fn read_to_close(stream: &mut TcpStream) -> Vec<u8> {
    let mut received = Vec::new();
    let mut buf = [0_u8; 4096];
    loop {
        match tokio::time::timeout(WAIT, stream.read(&mut buf)).await {
            Err(_) => panic!("the server kept the connection open past {WAIT:?}"),
            Ok(Ok(0)) | Ok(Err(_)) => return received,
            Ok(Ok(n)) => received.extend_from_slice(&buf[..n]),
        }
    }
}

/// The status code and JSON body of a raw HTTP/1.1 response.
fn parse_response(raw: &[u8]) -> (u16, Value) {
    let text = String::from_utf8_lossy(raw);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, body)| serde_json::from_str(body).unwrap_or(Value::String(body.to_owned())))
        .unwrap_or(Value::Null);
    (status, body)
}

#[tokio::test]
async fn idle_and_half_sent_connections_are_closed_at_the_header_deadline() {
    let runner = Runner::start_with(&[("RUNNER_HEADER_TIMEOUT_SECONDS", "1")]).await;
    let addr = addr_of(&runner.base);
    let mut idle = TcpStream::connect(&addr).await.unwrap();
    let mut half_sent = TcpStream::connect(&addr).await.unwrap();
    half_sent
        .write_all(b"GET /livez HTTP/1.1\r\nhost: runner\r\nx-slow: ")
        .await
        .unwrap();
    // A keep-alive connection is held only until its next request is due.
    let mut kept_alive = TcpStream::connect(&addr).await.unwrap();
    kept_alive
        .write_all(b"GET /livez HTTP/1.1\r\nhost: runner\r\n\r\n")
        .await
        .unwrap();
    let (idle_sent, half_sent_sent, kept_alive_sent) = tokio::join!(
        read_to_close(&mut idle),
        read_to_close(&mut half_sent),
        read_to_close(&mut kept_alive),
    );
    assert!(idle_sent.is_empty());
    assert!(half_sent_sent.is_empty());
    assert_eq!(parse_response(&kept_alive_sent).0, 200);
    runner.stop().await;
}

#[tokio::test]
async fn past_the_connection_limit_a_client_is_told_and_the_probes_still_answer() {
    const LIMIT: usize = 8;
    let runner = Runner::start_with(&[
        ("RUNNER_MAX_CONNECTIONS", "8"),
        ("RUNNER_MAX_CONNECTIONS_PER_CLIENT", "64"),
    ])
    .await;
    // Ready, so /readyz's own answer is 200.
    runner.service.as_ref().unwrap().recovered().await;
    let addr = addr_of(&runner.base);
    let deadline = Instant::now() + WAIT;
    // On a connection of its own that is gone before the test begins.
    while get_on(
        &mut TcpStream::connect(&addr).await.unwrap(),
        "/readyz",
        "connection: close\r\n",
    )
    .await
    .is_none_or(|(status, _)| status != 200)
    {
        assert!(Instant::now() < deadline, "the runner never became ready");
        tokio::task::yield_now().await;
    }
    // Connections are accepted in the order they were made, so once a
    // request on the last one of these is answered, all of them hold a slot.
    // Each has sent part of a request, so none is shed for a newcomer.
    let mut held = Vec::new();
    for _ in 0..LIMIT - 1 {
        held.push(half_sent(&addr).await);
    }
    let mut last = TcpStream::connect(&addr).await.unwrap();
    last.write_all(b"GET /livez HTTP/1.1\r\nhost: runner\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0_u8; 1024];
    let n = tokio::time::timeout(WAIT, last.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(parse_response(&buf[..n]).0, 200);
    held.push(last);

    // The kubelet's probes are served on slots of their own.
    for probe in ["/livez", "/readyz"] {
        let mut probed = TcpStream::connect(&addr).await.unwrap();
        probed
            .write_all(format!("GET {probe} HTTP/1.1\r\nhost: runner\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let (status, body) = parse_response(&read_to_close(&mut probed).await);
        assert_eq!(status, 200, "{probe} at the connection limit: {body}");
    }

    let mut refused = TcpStream::connect(&addr).await.unwrap();
    refused
        .write_all(b"GET /v1/health HTTP/1.1\r\nhost: runner\r\n\r\n")
        .await
        .unwrap();
    let (status, body) = parse_response(&read_to_close(&mut refused).await);
    assert_eq!(status, 503);
    assert_eq!(body["error"], json!("too_many_connections"));
    assert_eq!(
        body["message"],
        json!(
            "The runner is serving its limit of 8 connections (RUNNER_MAX_CONNECTIONS); try again shortly."
        )
    );

    drop(held);
    // The slots come back as the server sees the connections close.
    let deadline = Instant::now() + WAIT;
    // A raw connection per probe: until a slot is back the server answers
    // the refusal as soon as it accepts, before the request is read, which
    // an HTTP client library reports as an error rather than a status.
    loop {
        let mut probe = TcpStream::connect(&addr).await.unwrap();
        // The write fails when the refusal has already closed the socket.
        let _ = probe
            .write_all(b"GET /v1/health HTTP/1.1\r\nhost: runner\r\nconnection: close\r\n\r\n")
            .await;
        let answer = read_to_close(&mut probe).await;
        if !answer.is_empty() && parse_response(&answer).0 == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "/v1/health never answered again");
        tokio::task::yield_now().await;
    }
    runner.stop().await;
}

/// A connection that has sent the start of a request's header block.
async fn half_sent(addr: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /v1/health HTTP/1.1\r\nhost: runner\r\n")
        .await
        .unwrap();
    stream
}

/// A connection to `addr` from the loopback address `source` (the
/// 127.0.0.0/8 block is all loopback on Linux: another "client").
async fn connect_from(source: &str, addr: &str) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::new(source.parse().unwrap(), 0))
        .unwrap_or_else(|err| panic!("cannot bind {source} as a client address: {err}"));
    socket.connect(addr.parse().unwrap()).await.unwrap()
}

/// Sends one `GET` with `headers` and reads its answer: `None` when the
/// server closed the connection without one.
async fn get_on(stream: &mut TcpStream, path: &str, headers: &str) -> Option<(u16, Value)> {
    // The write fails when a refusal has already closed the socket.
    let _ = stream
        .write_all(format!("GET {path} HTTP/1.1\r\nhost: runner\r\n{headers}\r\n").as_bytes())
        .await;
    read_answer(stream).await
}

/// Reads one response: `None` when the server closed the connection
/// without one.
async fn read_answer(stream: &mut TcpStream) -> Option<(u16, Value)> {
    let mut received = Vec::new();
    let mut buf = [0_u8; 4096];
    loop {
        let n = match tokio::time::timeout(WAIT, stream.read(&mut buf)).await {
            Err(_) => panic!("no answer within {WAIT:?}"),
            Ok(Ok(0)) | Ok(Err(_)) => 0,
            Ok(Ok(n)) => n,
        };
        received.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&received);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|line| {
                    let (name, value) = line.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if body.len() >= length {
                return Some(parse_response(&received));
            }
        }
        if n == 0 {
            return (!received.is_empty()).then(|| parse_response(&received));
        }
    }
}

/// Writes a file holding `token` and returns its path (in `dir`).
fn tokens_file(dir: &std::path::Path, token: &str) -> String {
    let tokens = dir.join("tokens");
    std::fs::write(&tokens, format!("{token}\n")).unwrap();
    tokens.to_string_lossy().into_owned()
}

#[tokio::test]
async fn at_the_connection_limit_silent_connections_are_shed_for_new_ones() {
    const LIMIT: usize = 8;
    const TOKEN: &str = "tok-shed-7c2";
    let dir = tempfile::tempdir().unwrap();
    let tokens = tokens_file(dir.path(), TOKEN);
    // The header deadline is far past the test's waits: a connection closed
    // within them was shed, not timed out.
    let runner = Runner::start_with(&[
        ("RUNNER_MAX_CONNECTIONS", "8"),
        ("RUNNER_MAX_CONNECTIONS_PER_CLIENT", "1000"),
        ("RUNNER_HEADER_TIMEOUT_SECONDS", "120"),
        ("RUNNER_AUTH_TOKENS_FILE", tokens.as_str()),
    ])
    .await;
    runner.service.as_ref().unwrap().recovered().await;
    let addr = addr_of(&runner.base);
    let mut idle = Vec::new();
    for _ in 0..LIMIT * 3 {
        idle.push(TcpStream::connect(&addr).await.unwrap());
    }
    // Each of them was admitted, closing the oldest silent one at the limit.
    let mut oldest = idle.remove(0);
    assert!(read_to_close(&mut oldest).await.is_empty());

    // New clients get in at once, each shedding one more.
    let client = runner_core::http_client::client_builder()
        .timeout(WAIT)
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    for path in ["/livez", "/v1/health"] {
        let response = client
            .get(format!("{}{path}", runner.base))
            .send()
            .await
            .unwrap_or_else(|err| panic!("{path} at the limit: {err}"));
        assert_eq!(response.status(), StatusCode::OK, "{path}");
    }
    let created = client
        .post(format!("{}/v1/sessions", runner.base))
        .bearer_auth(TOKEN)
        .json(&start_body(json!({"exitCode": 0})))
        .send()
        .await
        .expect("an authorised POST at the limit");
    assert_eq!(created.status(), StatusCode::CREATED);
    // Each connection shed is counted.
    let metrics = client
        .get(format!("{}/metrics", runner.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let shed = turned_away(&metrics, "shed");
    assert!(shed >= 2 * LIMIT as u64, "{shed} shed:\n{metrics}");
    drop(idle);
    runner.stop().await;
}

/// `telo_runner_connections_turned_away_total{reason}` in an exposition.
fn turned_away(metrics: &str, reason: &str) -> u64 {
    let prefix = format!("telo_runner_connections_turned_away_total{{reason=\"{reason}\"}} ");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no {prefix} in:\n{metrics}"))
}

#[tokio::test]
async fn a_connection_mid_request_or_streaming_is_never_shed() {
    const LIMIT: usize = 8;
    let runner = Runner::start_with(&[
        ("RUNNER_MAX_CONNECTIONS", "8"),
        ("RUNNER_MAX_CONNECTIONS_PER_CLIENT", "1000"),
        ("RUNNER_HEADER_TIMEOUT_SECONDS", "120"),
    ])
    .await;
    let addr = addr_of(&runner.base);
    let id = runner.create(json!({"echo": true})).await;
    let mut events = runner.events(&id, &[]).await;
    let mut socket = runner.io(&id, "").await;
    // A request whose header block is on its way.
    let mut mid_request = half_sent(&addr).await;
    // A keep-alive connection between requests.
    let mut kept_alive = TcpStream::connect(&addr).await.unwrap();
    assert_eq!(
        get_on(&mut kept_alive, "/livez", "")
            .await
            .map(|(status, _)| status),
        Some(200)
    );

    // Silent connections, many times the limit: they shed each other.
    let mut idle = Vec::new();
    for _ in 0..LIMIT * 4 {
        idle.push(TcpStream::connect(&addr).await.unwrap());
    }
    let mut oldest = idle.remove(0);
    assert!(read_to_close(&mut oldest).await.is_empty());

    mid_request.write_all(b"\r\n").await.unwrap();
    let (status, _) = read_answer(&mut mid_request)
        .await
        .expect("the request finished after the flood is answered");
    assert_eq!(status, 200);
    assert_eq!(
        get_on(&mut kept_alive, "/v1/health", "")
            .await
            .map(|(status, _)| status),
        Some(200)
    );
    ws::send_stdin(&mut socket, b"still here\n").await;
    ws::read_until_output(&mut socket, "still here").await;
    // The event stream sees the session end.
    let (status, _) = runner.delete(&format!("/v1/sessions/{id}")).await;
    assert!(status.is_success(), "{status}");
    events
        .events_until(|frame| frame.status_kind().as_deref() == Some("stopped"))
        .await;
    drop(idle);
    runner.stop().await;
}

#[tokio::test]
async fn one_address_holds_its_share_of_connections_and_another_still_gets_in() {
    let runner = Runner::start_with(&[("RUNNER_MAX_CONNECTIONS_PER_CLIENT", "3")]).await;
    runner.service.as_ref().unwrap().recovered().await;
    let addr = addr_of(&runner.base);
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut stream = TcpStream::connect(&addr).await.unwrap();
        assert_eq!(
            get_on(&mut stream, "/v1/health", "")
                .await
                .map(|(status, _)| status),
            Some(200)
        );
        held.push(stream);
    }
    let mut refused = TcpStream::connect(&addr).await.unwrap();
    let (status, body) = get_on(&mut refused, "/v1/health", "")
        .await
        .expect("an answer past the client's share");
    assert_eq!(status, 429);
    assert_eq!(
        body,
        json!({
            "error": "too_many_connections_from_client",
            "message": "This client holds its limit of 3 connections to the runner (RUNNER_MAX_CONNECTIONS_PER_CLIENT); close one or try again shortly.",
        })
    );
    // The probes are still served.
    let mut probe = TcpStream::connect(&addr).await.unwrap();
    assert_eq!(
        get_on(&mut probe, "/livez", "")
            .await
            .map(|(status, _)| status),
        Some(200)
    );
    // Another address is another client.
    let mut other = connect_from("127.0.0.2", &addr).await;
    assert_eq!(
        get_on(&mut other, "/v1/health", "")
            .await
            .map(|(status, _)| status),
        Some(200)
    );
    // The refused connection and the probe's were past the share.
    let exposition = runner_core::http_client::client_builder()
        .local_address("127.0.0.3".parse::<std::net::IpAddr>().ok())
        .timeout(WAIT)
        .build()
        .unwrap()
        .get(format!("{}/metrics", runner.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(turned_away(&exposition, "client_full"), 2, "{exposition}");
    assert_eq!(turned_away(&exposition, "full"), 0, "{exposition}");
    // A connection that closes gives its place back.
    drop(held.pop());
    let deadline = Instant::now() + WAIT;
    loop {
        let mut again = TcpStream::connect(&addr).await.unwrap();
        if get_on(&mut again, "/v1/health", "connection: close\r\n")
            .await
            .is_some_and(|(status, _)| status == 200)
        {
            break;
        }
        assert!(Instant::now() < deadline, "the place never came back");
        tokio::task::yield_now().await;
    }
    runner.stop().await;
}

#[tokio::test]
async fn x_forwarded_for_names_the_client_only_from_a_trusted_proxy() {
    let runner = Runner::start_with(&[
        ("RUNNER_MAX_CONNECTIONS_PER_CLIENT", "2"),
        ("RUNNER_TRUSTED_PROXIES", "127.0.0.2"),
    ])
    .await;
    let addr = addr_of(&runner.base);
    let forwarded = |client: &str| format!("x-forwarded-for: 198.51.100.1, {client}\r\n");

    // The proxy holds more connections than one client may: each counts
    // against the client whose request it carries.
    let mut via_proxy = Vec::new();
    for _ in 0..2 {
        let mut stream = connect_from("127.0.0.2", &addr).await;
        let answer = get_on(&mut stream, "/v1/health", &forwarded("203.0.113.1")).await;
        assert_eq!(answer.map(|(status, _)| status), Some(200));
        via_proxy.push(stream);
    }
    let mut third = connect_from("127.0.0.2", &addr).await;
    let (status, body) = get_on(&mut third, "/v1/health", &forwarded("203.0.113.1"))
        .await
        .expect("an answer past the client's share");
    assert_eq!(status, 429);
    assert_eq!(body["error"], json!("too_many_connections_from_client"));
    assert!(
        read_to_close(&mut third).await.is_empty(),
        "the refused connection is closed"
    );
    let mut other_client = connect_from("127.0.0.2", &addr).await;
    let answer = get_on(&mut other_client, "/v1/health", &forwarded("203.0.113.2")).await;
    assert_eq!(answer.map(|(status, _)| status), Some(200));

    // From a peer that is not trusted the header is ignored: the peer is
    // the client, whatever it claims.
    let mut direct = Vec::new();
    for n in 0..2 {
        let mut stream = TcpStream::connect(&addr).await.unwrap();
        let answer = get_on(
            &mut stream,
            "/v1/health",
            &forwarded(&format!("203.0.113.{}", 10 + n)),
        )
        .await;
        assert_eq!(answer.map(|(status, _)| status), Some(200));
        direct.push(stream);
    }
    let mut refused = TcpStream::connect(&addr).await.unwrap();
    let answer = get_on(&mut refused, "/v1/health", &forwarded("203.0.113.20")).await;
    assert_eq!(answer.map(|(status, _)| status), Some(429));
    runner.stop().await;
}

#[tokio::test]
async fn an_oversized_header_block_is_431_and_a_stalled_body_is_408() {
    let runner = Runner::start_with(&[("RUNNER_BODY_TIMEOUT_SECONDS", "1")]).await;
    let addr = addr_of(&runner.base);
    let mut big = TcpStream::connect(&addr).await.unwrap();
    let padding = "a".repeat(20 * 1024);
    big.write_all(
        format!("GET /livez HTTP/1.1\r\nhost: runner\r\nx-pad: {padding}\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(parse_response(&read_to_close(&mut big).await).0, 431);

    let mut stalled = TcpStream::connect(&addr).await.unwrap();
    stalled
        .write_all(
            b"POST /v1/sessions HTTP/1.1\r\nhost: runner\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"bundle\":",
        )
        .await
        .unwrap();
    let mut buf = [0_u8; 2048];
    let n = tokio::time::timeout(WAIT, stalled.read(&mut buf))
        .await
        .expect("no answer to a stalled body")
        .unwrap();
    let (status, body) = parse_response(&buf[..n]);
    assert_eq!(status, 408);
    assert_eq!(
        body,
        json!({"error": "request_timeout", "message": "The request body did not arrive within 1 s"})
    );
    runner.stop().await;
}

/// The figures of the hardening report: under a shell's default open-file
/// limit (1024), 1,100 idle connections and 3,000 that hold an unfinished
/// 15 KiB header block, all from one address, leave `/livez` and an
/// authorised POST from another address answering, and the runner's memory
/// bounded. Latencies are printed, not asserted.
#[tokio::test]
async fn thousands_of_idle_and_slow_connections_leave_probes_and_posts_answering() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    const IDLE: usize = 1_100;
    const SLOW: usize = 3_000;
    const TOKEN: &str = "tok-connections-5e1";
    // This process holds every client socket.
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    assert!(
        hard > (IDLE + SLOW + 512) as u64,
        "this host's open-file hard limit ({hard}) is too low for the test"
    );
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("{TOKEN}\n")).unwrap();
    let tokens = tokens.to_string_lossy().into_owned();
    let runner = RunnerProcess::spawn_with_open_file_limit(
        Backend::Local,
        dir.path(),
        None,
        &[("RUNNER_AUTH_TOKENS_FILE", tokens.as_str())],
        Some(1024),
    )
    .await;
    let addr = addr_of(&runner.base);
    let rss_before = runner.rss_bytes();

    let mut connections = Vec::with_capacity(IDLE + SLOW);
    for _ in 0..IDLE {
        connections.push(TcpStream::connect(&addr).await.unwrap());
    }
    let unfinished = format!(
        "GET /v1/sessions HTTP/1.1\r\nhost: runner\r\nx-slow: {}",
        "s".repeat(15 * 1024)
    );
    for _ in 0..SLOW {
        let mut slow = TcpStream::connect(&addr).await.unwrap();
        slow.write_all(unfinished.as_bytes()).await.unwrap();
        connections.push(slow);
    }

    // The attack holds its address's share of the connections; the editor
    // is another client.
    let client = runner_core::http_client::client_builder()
        .timeout(WAIT)
        .local_address("127.0.0.2".parse::<std::net::IpAddr>().unwrap())
        .build()
        .unwrap();
    let started = Instant::now();
    let livez = client
        .get(format!("{}/livez", runner.base))
        .send()
        .await
        .expect("/livez answers under the load");
    let livez_latency = started.elapsed();
    assert_eq!(livez.status(), StatusCode::OK);
    let started = Instant::now();
    let created = client
        .post(format!("{}/v1/sessions", runner.base))
        .bearer_auth(TOKEN)
        .json(&start_body(json!({"exitCode": 0})))
        .send()
        .await
        .expect("an authorised POST answers under the load");
    let post_latency = started.elapsed();
    assert_eq!(created.status(), StatusCode::CREATED);
    let rss_loaded = runner.rss_bytes();
    eprintln!(
        "{IDLE} idle + {SLOW} slow connections: /livez {livez_latency:?}, POST {post_latency:?}, RSS {} MB -> {} MB",
        rss_before / 1_000_000,
        rss_loaded / 1_000_000
    );
    assert!(
        rss_loaded < 200_000_000,
        "RSS grew to {rss_loaded} bytes under the load"
    );
    drop(connections);
}

/// An event stream held open until dropped.
async fn open_events(runner: &Runner, id: &str, token: Option<&str>) -> reqwest::Response {
    let mut request = runner
        .client
        .get(runner.url(&format!("/v1/sessions/{id}/events")));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    request.send().await.unwrap()
}

/// A terminal socket's handshake: the socket, or the HTTP answer that
/// refused it before the upgrade.
async fn open_io(
    runner: &Runner,
    id: &str,
) -> Result<
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStream>>,
    (u16, Value),
> {
    match tokio_tungstenite::connect_async(runner.ws_url(&format!("/v1/sessions/{id}/io"))).await {
        Ok((socket, _)) => Ok(socket),
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            let status = response.status().as_u16();
            let body = response
                .body()
                .as_ref()
                .map(|body| serde_json::from_slice(body).unwrap())
                .unwrap_or(Value::Null);
            Err((status, body))
        }
        Err(err) => panic!("the handshake failed: {err}"),
    }
}

#[tokio::test]
async fn a_session_past_its_subscriber_cap_refuses_the_next_stream_and_socket() {
    let runner = Runner::start_with(&[("RUNNER_MAX_SUBSCRIBERS_PER_SESSION", "2")]).await;
    let id = runner.create(json!({"echo": true})).await;
    let message = format!(
        "session '{id}' has its limit of 2 subscribers open (event streams and terminal sockets; RUNNER_MAX_SUBSCRIBERS_PER_SESSION)"
    );
    let first = open_events(&runner, &id, None).await;
    assert_eq!(first.status(), StatusCode::OK);
    let socket = open_io(&runner, &id)
        .await
        .expect("the second subscriber is admitted");

    let refused = open_events(&runner, &id, None).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        refused.json::<Value>().await.unwrap(),
        json!({"error": "too_many_subscribers", "message": message})
    );
    let Err((status, body)) = open_io(&runner, &id).await else {
        panic!("the third subscriber was upgraded");
    };
    assert_eq!(status, 429);
    assert_eq!(
        body,
        json!({"error": "too_many_subscribers", "message": message})
    );

    // Another session is not affected.
    let other = runner.create(json!({"echo": true})).await;
    assert_eq!(
        open_events(&runner, &other, None).await.status(),
        StatusCode::OK
    );

    // A subscriber that leaves gives its place back.
    drop(socket);
    let deadline = Instant::now() + WAIT;
    loop {
        match open_io(&runner, &id).await {
            Ok(_) => break,
            Err((429, _)) => {
                assert!(
                    Instant::now() < deadline,
                    "the socket's place never came back"
                );
                tokio::task::yield_now().await;
            }
            Err(other) => panic!("{other:?}"),
        }
    }
    drop(first);
    runner.stop().await;
}

#[tokio::test]
async fn a_client_past_its_subscriber_cap_is_refused_on_every_session_and_others_are_not() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    // The other token is an admin, so it sees the greedy token's sessions.
    std::fs::write(&tokens, "greedy-token\nother-token admin\n").unwrap();
    let runner = Runner::start_with(&[
        ("RUNNER_MAX_SUBSCRIBERS_PER_CLIENT", "2"),
        ("RUNNER_AUTH_TOKENS_FILE", tokens.to_str().unwrap()),
    ])
    .await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let created: Value = runner
            .client
            .post(runner.url("/v1/sessions"))
            .bearer_auth("greedy-token")
            .json(&start_body(json!({"echo": true})))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        ids.push(created["sessionId"].as_str().unwrap().to_owned());
    }
    let held = [
        open_events(&runner, &ids[0], Some("greedy-token")).await,
        open_events(&runner, &ids[0], Some("greedy-token")).await,
    ];
    assert!(held.iter().all(|stream| stream.status() == StatusCode::OK));
    let refused = open_events(&runner, &ids[1], Some("greedy-token")).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        refused.json::<Value>().await.unwrap(),
        json!({
            "error": "too_many_subscribers",
            "message": "this client holds its limit of 2 subscribers open across sessions (event streams and terminal sockets; RUNNER_MAX_SUBSCRIBERS_PER_CLIENT)",
        })
    );
    // Another token is another client, from the same address.
    let other = open_events(&runner, &ids[1], Some("other-token")).await;
    assert_eq!(other.status(), StatusCode::OK);
    drop(held);
    runner.stop().await;
}
