//! A minimal HTTP/1.1 client over a unix socket, enough for podman's and
//! Docker's REST APIs: one request per connection (`Connection: close`), JSON
//! bodies, and `Content-Length` or chunked responses.

use crate::error::{Error, Result};
use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Response {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends one request; `body` is JSON when given.
pub async fn request(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
) -> std::io::Result<Response> {
    let mut stream = UnixStream::connect(socket).await?;
    let payload = body.map(|b| b.to_string()).unwrap_or_default();
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: d\r\nConnection: close\r\n");
    if body.is_some() {
        head.push_str("Content-Type: application/json\r\n");
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n", payload.len()));
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(payload.as_bytes()).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    parse(&raw).ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidData, "malformed HTTP response")
    })
}

/// An engine's API on its unix socket, as errors name it.
pub struct Api<'a> {
    /// "podman" or "Docker".
    pub name: &'static str,
    /// What hangs when nothing answers: "the podman service", "dockerd".
    pub service: &'static str,
    pub socket: &'a Path,
    /// What to do when the socket cannot be reached, by the error's kind
    /// ("; is dockerd running …"); None: the error says enough.
    pub hint: fn(std::io::ErrorKind) -> Option<String>,
}

impl Api<'_> {
    /// One call that must be answered within `limit` (None: a long poll).
    /// Without a limit an engine that accepts and never answers left a
    /// worker "starting", with no reason, for ever.
    pub async fn call(
        &self,
        limit: Option<Duration>,
        what: &str,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<Response> {
        let socket = self.socket.display();
        let sent = request(self.socket, method, path, body);
        let answered = match limit {
            Some(limit) => tokio::time::timeout(limit, sent).await.map_err(|_| {
                self.error(
                    what,
                    format!(
                        "no answer within {} s (socket {socket}); is {} hung?",
                        limit.as_secs_f64(),
                        self.service
                    ),
                )
            })?,
            None => sent.await,
        };
        answered.map_err(|e| self.unreachable(what, &e))
    }

    /// `<engine> <what>: <e>`.
    pub fn error(&self, what: &str, e: impl std::fmt::Display) -> Error {
        Error::Backend(format!("{} {what}: {e}", self.name))
    }

    /// A socket that cannot be reached, with the engine's word on what to do.
    fn unreachable(&self, what: &str, e: &std::io::Error) -> Error {
        let socket = self.socket.display();
        let hint = (self.hint)(e.kind()).unwrap_or_default();
        self.error(what, format!("{e} (socket {socket}){hint}"))
    }
}

/// Whether an engine answers `GET /_ping` (podman and Docker both serve
/// it) on `socket` within `limit`.
pub async fn pings(socket: &Path, limit: Duration) -> bool {
    let asked = request(socket, "GET", "/_ping", None);
    matches!(tokio::time::timeout(limit, asked).await, Ok(Ok(r)) if r.status == 200)
}

fn parse(raw: &[u8]) -> Option<Response> {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..split]).ok()?;
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let chunked = lines.any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let rest = &raw[split + 4..];
    let body = if chunked {
        dechunk(rest)?
    } else {
        rest.to_vec()
    };
    Some(Response { status, body })
}

fn dechunk(mut data: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = data.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&data[..eol]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        data = &data[eol + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(data.get(..size)?);
        data = data.get(size + 2..)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_chunked_bodies() {
        let r = parse(b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}").unwrap();
        assert_eq!((r.status, r.text().as_str()), (201, "{}"));
        let r = parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n").unwrap();
        assert_eq!(r.text(), "abcde");
        assert!(parse(b"garbage").is_none());
    }
}
