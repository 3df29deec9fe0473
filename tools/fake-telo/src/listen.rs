//! `listen:` ports: plain TCP listeners that answer any HTTP request with
//! `200 ok <port>`, so tests can prove that traffic reached *this* workload
//! through whatever the runner put in between.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use crate::http;

/// Back-off after a failed accept (e.g. out of descriptors) so the accept
/// loop does not spin a core while the condition lasts.
const ACCEPT_RETRY_DELAY: Duration = Duration::from_millis(10);

/// The body a `listen` port answers with.
pub fn ok_body(port: u16) -> String {
    format!("ok {port}")
}

/// Serves `ok <port>` on `listener` from a background thread for the rest of
/// the process's life. Returns the port actually bound (`listen: [0]` picks one).
pub fn serve_ok(listener: TcpListener) -> std::io::Result<u16> {
    let port = listener.local_addr()?.port();
    thread::Builder::new()
        .name(format!("listen-{port}"))
        .spawn(move || accept_loop(&listener, port, None))?;
    Ok(port)
}

/// How long closing a listener waits for its wake-up connection.
const WAKE_TIMEOUT: Duration = Duration::from_secs(1);

/// A `listen` port that can be closed again (a `--watch` generation's).
pub struct StoppableListener {
    port: u16,
    wake: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl StoppableListener {
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Closes the port: returns once the listener is dropped, so the next
    /// generation can bind the same port at once.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // The accept loop is blocked in accept(): a connection wakes it up.
        let _ = TcpStream::connect_timeout(&self.wake, WAKE_TIMEOUT);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// As [`serve_ok`], until [`StoppableListener::stop`].
pub fn serve_ok_until_stopped(listener: TcpListener) -> std::io::Result<StoppableListener> {
    let local = listener.local_addr()?;
    let port = local.port();
    let wake_ip = match local.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let stop_flag = Arc::clone(&stop);
    let thread = thread::Builder::new()
        .name(format!("listen-{port}"))
        .spawn(move || accept_loop(&listener, port, Some(&stop_flag)))?;
    Ok(StoppableListener {
        port,
        wake: SocketAddr::new(wake_ip, port),
        stop,
        thread: Some(thread),
    })
}

fn accept_loop(listener: &TcpListener, port: u16, stop: Option<&AtomicBool>) {
    let stopped = || stop.is_some_and(|stop| stop.load(Ordering::SeqCst));
    loop {
        let accepted = listener.accept();
        if stopped() {
            return;
        }
        match accepted {
            Ok((stream, _)) => {
                // A connection whose thread cannot be spawned is dropped; the
                // client sees a closed connection, as under real overload.
                let _ = thread::Builder::new()
                    .name(format!("listen-{port}-conn"))
                    .spawn(move || answer_ok(stream, port));
            }
            Err(_) => thread::sleep(ACCEPT_RETRY_DELAY),
        }
    }
}

fn answer_ok(mut stream: TcpStream, port: u16) {
    // A probe that connects and hangs up has sent no request: nothing to answer.
    if http::read_request_head(&mut stream).is_none() {
        return;
    }
    let response = http::full_response("200 OK", "text/plain; charset=utf-8", &ok_body(port));
    let _ = http::respond_and_close(stream, &response);
}
