//! Just enough HTTP/1.1 over std sockets for the two servers fake-telo runs.
//! Both answer one request per connection and close it, which keeps a
//! blocking thread-per-connection design simple and start-up instant.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::Duration;

/// A client that connects and never finishes its request must not pin a
/// thread forever (reachability probes connect and hang up without one).
const REQUEST_HEAD_TIMEOUT: Duration = Duration::from_secs(5);
const REQUEST_HEAD_MAX_BYTES: usize = 16 * 1024;
/// How long to drain an unread request body before closing. Closing a socket
/// with unread input makes the kernel send RST, which can destroy the
/// response before the client reads it.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    pub method: String,
    /// The path without its query string.
    pub path: String,
}

/// Reads the request head (up to the blank line). `None` when the client sent
/// nothing usable before hanging up, timing out or exceeding the size limit.
pub fn read_request_head(stream: &mut TcpStream) -> Option<RequestHead> {
    stream.set_read_timeout(Some(REQUEST_HEAD_TIMEOUT)).ok()?;
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0_u8; 1024];
    while !head.windows(4).any(|window| window == b"\r\n\r\n")
        && !head.windows(2).any(|window| window == b"\n\n")
        && head.len() < REQUEST_HEAD_MAX_BYTES
    {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(read) => head.extend_from_slice(&chunk[..read]),
        }
    }
    parse_request_line(&head)
}

/// Parses `METHOD /path?query HTTP/1.x` from the start of a request head.
pub fn parse_request_line(head: &[u8]) -> Option<RequestHead> {
    let line_end = head.iter().position(|&byte| byte == b'\n')?;
    let line = std::str::from_utf8(&head[..line_end]).ok()?.trim_end();
    let mut parts = line.split(' ');
    let method = parts.next().filter(|method| !method.is_empty())?;
    let target = parts.next()?;
    let version = parts.next()?;
    if !version.starts_with("HTTP/") || parts.next().is_some() {
        return None;
    }
    let path = target.split(['?', '#']).next().unwrap_or(target);
    Some(RequestHead {
        method: method.to_owned(),
        path: path.to_owned(),
    })
}

/// Formats a complete response with a body and `Connection: close`.
pub fn full_response(status: &str, content_type: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// Writes a complete response and closes the connection politely.
pub fn respond_and_close(mut stream: TcpStream, response: &str) -> io::Result<()> {
    stream.write_all(response.as_bytes())?;
    stream.flush()?;
    close_gracefully(stream);
    Ok(())
}

fn close_gracefully(mut stream: TcpStream) {
    if stream.shutdown(Shutdown::Write).is_err() {
        return;
    }
    if stream.set_read_timeout(Some(DRAIN_TIMEOUT)).is_err() {
        return;
    }
    let mut sink = [0_u8; 4096];
    while let Ok(read) = stream.read(&mut sink) {
        if read == 0 {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines_are_split_into_method_and_path() {
        type MethodAndPath = Option<(&'static str, &'static str)>;
        let cases: &[(&[u8], MethodAndPath)] = &[
            (
                b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n",
                Some(("GET", "/events")),
            ),
            (
                b"GET /events?lastEventId=0 HTTP/1.1\r\n\r\n",
                Some(("GET", "/events")),
            ),
            (b"POST / HTTP/1.0\n\n", Some(("POST", "/"))),
            (b"GET /events HTTP/1.1", None),
            (b"garbage\r\n\r\n", None),
            (b"GET / SPDY/3 extra\r\n", None),
            (b"", None),
        ];
        for (head, expected) in cases {
            let expected = expected.map(|(method, path)| RequestHead {
                method: method.to_owned(),
                path: path.to_owned(),
            });
            assert_eq!(
                parse_request_line(head),
                expected,
                "{:?}",
                String::from_utf8_lossy(head)
            );
        }
    }

    #[test]
    fn full_responses_carry_their_length_and_close() {
        assert_eq!(
            full_response("200 OK", "text/plain", "ok 8080"),
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 7\r\nConnection: close\r\n\r\nok 8080"
        );
    }
}
