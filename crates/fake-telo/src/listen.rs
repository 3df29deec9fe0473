//! `listen:` ports: plain TCP listeners that answer any HTTP request with
//! `200 ok <port>`, so tests can prove that traffic reached *this* workload
//! through whatever the runner put in between.

use std::net::{TcpListener, TcpStream};
use std::thread;
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
        .spawn(move || accept_loop(&listener, port))?;
    Ok(port)
}

fn accept_loop(listener: &TcpListener, port: u16) {
    loop {
        match listener.accept() {
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
