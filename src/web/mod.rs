//! The machine page: an optional read-only HTTP server (off unless
//! `http.listen` is set; loopback by default). A thin adaptor like the bus
//! layer: each request asks the service loop for a snapshot and translates
//! it to the seed's JSON, Prometheus text or the HTML page. Nothing served
//! changes state; any method but GET (and HEAD) gets 405.

mod first_paint;
mod metrics;
mod places;
use places::{
    refuse, AddressWaits, Place, Reading, MAX_CONNECTIONS, MAX_PER_ADDRESS, TOO_MANY_FROM_ADDRESS,
    WAITING,
};

pub use metrics::metrics;

use crate::bus::tree::Objects;
use crate::command::Command;
pub use crate::views::{GpuSnap, PageSnapshot, SliceSnap, WorkerSnap};
use crate::wire::SliceTriple;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

const PAGE: &str = include_str!("page.html");
/// Requests are a line and a few headers; anything larger is refused.
const MAX_HEAD: usize = 8 * 1024;
/// A request head must arrive within this long (a slow client is dropped).
const HEAD_TIMEOUT: Duration = Duration::from_secs(3);
/// A whole connection, answer included.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);
/// A client that takes none of its answer for this long is dropped: one
/// that asked for a big answer (the workers of a busy host, more than the
/// sockets' buffers hold) and never read it held its place for the whole
/// connection's time, and 64 of them held the page.
const WRITE_STALL: Duration = Duration::from_secs(2);

/// Who may be named in the Host header: IP addresses, `localhost`, this
/// host's name and the configured names (DNS rebinding names another).
#[derive(Clone, Debug, Default)]
pub struct Hosts {
    pub names: Vec<String>,
}

impl Hosts {
    /// Whether a Host header's value (`name[:port]`) may be served.
    pub fn allows(&self, host: &str) -> bool {
        let name = match host.strip_prefix('[') {
            Some(v6) => {
                return v6
                    .split(']')
                    .next()
                    .is_some_and(|a| a.parse::<std::net::Ipv6Addr>().is_ok())
            }
            None => host.rsplit_once(':').map_or(host, |(n, p)| {
                if p.chars().all(|c| c.is_ascii_digit()) {
                    n
                } else {
                    host
                }
            }),
        };
        name.parse::<std::net::Ipv4Addr>().is_ok()
            || name.eq_ignore_ascii_case("localhost")
            || self.names.iter().any(|n| n.eq_ignore_ascii_case(name))
    }
}

/// Serves until the listener fails; each connection in a task of its own.
/// Serves the page: `tx` reaches the service loop (for what only it knows:
/// the GPUs, slices, counters); `objects` gives the workers, read off the
/// loop (at 100,000 workers they take seconds to gather).
pub async fn serve(
    listener: TcpListener,
    tx: mpsc::Sender<Command>,
    objects: Objects,
    hosts: Hosts,
) {
    let reading = Arc::new(std::sync::Mutex::new(Reading::default()));
    let hosts = Arc::new(hosts);
    let mut next_id = 0u64;
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let from = peer.ip();
        next_id += 1;
        let id = next_id;
        {
            let mut r = reading.lock().unwrap_or_else(|e| e.into_inner());
            let held = r.by_address.get(&from).copied().unwrap_or(0);
            if held >= MAX_PER_ADDRESS {
                // Its share is taken: the slowest of its own heads makes
                // room, else it is told at once, never waited on.
                match r.slowest_head_of(from) {
                    Some(slow) => slow.abort(),
                    None => {
                        drop(r);
                        refuse(stream, TOO_MANY_FROM_ADDRESS);
                        continue;
                    }
                }
            }
            if r.open >= MAX_CONNECTIONS {
                match r.place_for(from) {
                    // Its task ends: its place is freed by its guard.
                    Some(taken) => taken.abort(),
                    // Every place answers a request of an address holding
                    // no more than this one's: this one waits its turn in
                    // the kernel's queue no longer than they take.
                    None => {
                        drop(r);
                        drop(stream);
                        continue;
                    }
                }
            }
            r.open += 1;
            *r.by_address.entry(from).or_default() += 1;
        }
        let (tx, objects, hosts, guard_reading) =
            (tx.clone(), objects.clone(), hosts.clone(), reading.clone());
        let task_reading = reading.clone();
        // The task starts once it is listed as reading (so that having read
        // its head always takes it off the list).
        let (listed, go) = oneshot::channel::<()>();
        // Made here and moved in: dropped with the task even when it is
        // aborted before it ever ran.
        let place = Place {
            id,
            from,
            reading: guard_reading,
        };
        let task = tokio::spawn(async move {
            let _place = place;
            if go.await.is_err() {
                return;
            }
            let _ = tokio::time::timeout(
                CONNECTION_TIMEOUT,
                connection(stream, from, tx, objects, &hosts, || {
                    let mut r = task_reading.lock().unwrap_or_else(|e| e.into_inner());
                    r.heads.retain(|(i, _, _)| *i != id);
                }),
            )
            .await;
        });
        {
            let mut r = reading.lock().unwrap_or_else(|e| e.into_inner());
            r.heads
                .push_back((id, task.abort_handle(), std::time::Instant::now()));
            r.all.insert(id, (from, task.abort_handle()));
        }
        let _ = listed.send(());
    }
}

async fn connection(
    mut stream: TcpStream,
    from: std::net::IpAddr,
    tx: mpsc::Sender<Command>,
    objects: Objects,
    hosts: &Hosts,
    head_read: impl FnOnce(),
) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + HEAD_TIMEOUT;
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(read) => read?,
            Err(_) => return Ok(()), // too slow: dropped
        };
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > MAX_HEAD {
            let r = Response::error(431, "the request head is too large");
            stream.write_all(&r.bytes(false)).await?;
            // Read what the client still sends (bounded), so closing does not
            // reset the connection before it has read the answer.
            stream.shutdown().await?;
            let mut left = 1 << 20;
            while left > 0 {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => left -= n.min(left),
                }
            }
            return Ok(());
        }
    }
    head_read();
    let text = String::from_utf8_lossy(&head);
    let mut parts = text.lines().next().unwrap_or_default().split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let response = match (host_of(&text), method) {
        (Err(why), _) => Response::error(400, why),
        (Ok(Some(h)), _) if !hosts.allows(h) => Response::error(
            421,
            "this page answers to its IP addresses, localhost and the names in http.names",
        ),
        (_, "GET" | "HEAD") => route(target, from, &tx, &objects).await,
        _ => Response::error(
            405,
            &format!("{method} is not served here: the page is read-only"),
        ),
    };
    write_answer(&mut stream, &response.bytes(method == "HEAD")).await
}

/// Writes `bytes`, giving up when the client takes none of them for
/// [`WRITE_STALL`] (each write returns once the socket takes some).
async fn write_answer(stream: &mut TcpStream, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        let taken = tokio::time::timeout(WRITE_STALL, stream.write(bytes))
            .await
            .map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the client took none of the answer",
                )
            })??;
        if taken == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        bytes = &bytes[taken..];
    }
    Ok(())
}

/// The request's Host header, if it has one. Only the head's lines count
/// (not what a client sent after it), and a request naming the host twice
/// is refused (RFC 9112, 3.2): one check reading the first and a proxy in
/// front reading the last would disagree about which host was asked.
fn host_of(request: &str) -> Result<Option<&str>, &'static str> {
    let head = request.split("\r\n\r\n").next().unwrap_or_default();
    let mut host = None;
    for line in head.lines().skip(1) {
        // Both are read as another header, or another Host, by some
        // parsers and refused by the RFC (9112, 5.1 and 5.2).
        if line.starts_with([' ', '\t']) {
            return Err("a header line is folded onto the one before");
        }
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        if name.ends_with([' ', '\t']) {
            return Err("a header's name is followed by whitespace before its colon");
        }
        if name.eq_ignore_ascii_case("host") {
            if host.is_some() {
                return Err("the request names its Host more than once");
            }
            host = Some(value.trim());
        }
    }
    Ok(host)
}

/// One response, always closing the connection.
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
}

impl Response {
    fn json(status: u16, v: &Value) -> Response {
        Response {
            status,
            content_type: "application/json",
            body: serde_json::to_string_pretty(v).expect("json") + "\n",
        }
    }

    fn error(status: u16, message: &str) -> Response {
        Response::json(status, &json!({ "error": message }))
    }

    fn bytes(&self, head_only: bool) -> Vec<u8> {
        let reason = match self.status {
            200 => "OK",
            404 => "Not Found",
            405 => "Method Not Allowed",
            421 => "Misdirected Request",
            431 => "Request Header Fields Too Large",
            503 => "Service Unavailable",
            _ => "Error",
        };
        let allow = if self.status == 405 {
            "Allow: GET, HEAD\r\n"
        } else {
            ""
        };
        let mut out = format!(
            "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{allow}\
             Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n\
             Content-Security-Policy: default-src 'self'; style-src 'unsafe-inline'; script-src 'unsafe-inline'\r\n\
             Connection: close\r\n\r\n",
            self.status,
            self.content_type,
            self.body.len()
        )
        .into_bytes();
        if !head_only {
            out.extend_from_slice(self.body.as_bytes());
        }
        out
    }
}

/// The loop's snapshot; None when the address's or the page's share of
/// the queue, or the queue, is full (or the loop stopping).
async fn snapshot(from: std::net::IpAddr, tx: &mpsc::Sender<Command>) -> Option<PageSnapshot> {
    let _mine = AddressWaits::take(from)?;
    let _turn = WAITING.try_acquire().ok()?;
    let (reply, rx) = oneshot::channel();
    tx.try_send(Command::PageSnapshot { reply }).ok()?;
    rx.await.ok()
}

async fn route(
    target: &str,
    from: std::net::IpAddr,
    tx: &mpsc::Sender<Command>,
    objects: &Objects,
) -> Response {
    let path = target.split(['?', '#']).next().unwrap_or("");
    let Some(mut snap) = snapshot(from, tx).await else {
        return Response::error(503, "the daemon is busy or stopping; try again");
    };
    if shows_workers(path) {
        let Some(workers) = objects
            .worker_snaps(from, crate::auth::user_name_or_uid)
            .await
        else {
            return Response::error(503, "the daemon is busy; try again");
        };
        snap.workers = workers;
    }
    respond(path, &snap)
}

/// Whether the page at `path` shows the workers (every page does; a path
/// that is not one is answered without them). Decoded as [`respond`]
/// decodes it: `/%6Detrics` is /metrics, and said there were none.
fn shows_workers(path: &str) -> bool {
    let first = percent_decode(path.trim_start_matches('/').split('/').next().unwrap_or(""));
    matches!(first.as_str(), "" | "metrics" | "machines")
}

/// The answer for a path, from a snapshot (pure: tested without a socket).
pub fn respond(path: &str, snap: &PageSnapshot) -> Response {
    let segments: Vec<String> = path
        .trim_start_matches('/')
        .split('/')
        .map(percent_decode)
        .collect();
    let seg: Vec<&str> = segments.iter().map(String::as_str).collect();
    match seg.as_slice() {
        [""] => Response {
            status: 200,
            content_type: "text/html; charset=utf-8",
            body: first_paint::page(PAGE, snap, &served_at(snap)),
        },
        ["metrics"] => Response {
            status: 200,
            content_type: "text/plain; version=0.0.4; charset=utf-8",
            body: metrics(snap),
        },
        ["machines", name] | ["machines", name, "workers"] if *name != snap.machine => {
            Response::error(
                404,
                &format!("no machine named {name:?} here; this is {}", snap.machine),
            )
        }
        ["machines", _] => Response::json(200, &machine_json(snap)),
        ["machines", _, "workers"] => Response::json(200, &workers_json(snap)),
        _ => Response::error(
            404,
            &format!(
                "nothing at {path:?}: try /, /machines/{0}, /machines/{0}/workers or /metrics",
                snap.machine
            ),
        ),
    }
}

/// The time the page was served, in the machine's zone: `10:31:05`.
fn served_at(snap: &PageSnapshot) -> String {
    let tz = jiff::tz::TimeZone::get(&snap.time_zone).unwrap_or(jiff::tz::TimeZone::UTC);
    jiff::Timestamp::now()
        .to_zoned(tz)
        .strftime("%H:%M:%S")
        .to_string()
}

/// -1 means "the board cannot tell": JSON null.
fn known(v: f64) -> Value {
    if v < 0.0 {
        Value::Null
    } else {
        json!(v)
    }
}

fn slice_json(s: &Option<SliceTriple>, tz: &jiff::tz::TimeZone) -> Value {
    let at = |ms: i64| {
        jiff::Timestamp::from_millisecond(ms)
            .map(|t| {
                t.to_zoned(tz.clone())
                    .strftime("%Y-%m-%dT%H:%M:%S%:z")
                    .to_string()
            })
            .unwrap_or_default()
    };
    match s {
        // Instants in epoch ms, as every JSON here; the local date-times
        // (`start`, `end`) are kept for one release (docs/operations.md).
        Some(t) => json!({
            "start_ms": t.start_ms, "end_ms": t.end_ms,
            "start": at(t.start_ms), "end": at(t.end_ms), "ends_by": t.ends_by,
        }),
        None => Value::Null,
    }
}

pub fn machine_json(snap: &PageSnapshot) -> Value {
    let tz = jiff::tz::TimeZone::get(&snap.time_zone).unwrap_or(jiff::tz::TimeZone::UTC);
    let gpus: Vec<Value> = snap
        .gpus
        .iter()
        .map(|g| {
            let v = &g.view;
            json!({
                "index": v.index, "uuid": v.uuid, "model": v.model, "mode": v.mode,
                "healthy": v.healthy, "health": v.health,
                "total_gb": v.total_gb, "offered_gb": v.offered_gb,
                "held_outside_gb": v.held_outside_gb, "beyond_shares_gb": v.beyond_shares_gb,
                "taken_gb": v.taken_gb,
                "sharers": v.sharers.iter().map(|(w, gb)| json!({"worker": &**w, "gb": gb.as_f64()})).collect::<Vec<_>>(),
                "held_whole_by": (!v.held_whole_by.is_empty()).then_some(&v.held_whole_by),
                "draining_for": (!v.draining_for.is_empty()).then_some(&v.draining_for),
                "summary": v.summary, "offers": g.offers, "used_gb": g.used_gb,
                "power_w": known(v.power_w), "utilization_pct": known(v.utilization_pct as f64),
                "warning": v.warning, "share_limits": v.share_limits,
            })
        })
        .collect();
    let slices: Vec<Value> = snap
        .slices
        .iter()
        .map(|s| {
            json!({
                "template": s.template,
                "state": s.state,
                "handoff_dead_time_ms": s.dead_time_ms,
                "active": slice_json(&s.active, &tz),
                "next": slice_json(&s.next, &tz),
            })
        })
        .collect();
    json!({ "machine": snap.machine, "time_zone": snap.time_zone, "gpus": gpus, "slices": slices })
}

pub fn workers_json(snap: &PageSnapshot) -> Value {
    let workers: Vec<Value> = snap
        .workers
        .iter()
        .map(|w| {
            let v = &w.view;
            let mut o = json!({
                "name": v.name, "state": v.state.as_str(), "owner": w.owner,
                "gpus": v.gpus.iter().map(|(i, u)| json!({"index": i, "uuid": u})).collect::<Vec<_>>(),
                // Null where nothing is read: waiting (no GPU), or no reading.
                "gpu_used_gb": if v.gpus.is_empty() { Value::Null } else { known(v.gpu_used_gb) },
                "pending_reasons": w.pending_reasons, "warnings": v.warnings,
                // `held`, or `promised: why`; null while it waits.
                "enforcement": (v.state != crate::worker::State::Pending).then_some(&v.enforcement),
            });
            // A shared worker's share, waiting or placed (astraeusctl's
            // JSON says it of both; #66: the page left it out while waiting).
            if v.gpu_shared_gb > 0.0 {
                o["gpu_shared_gb"] = json!(v.gpu_shared_gb);
            }
            o
        })
        .collect();
    json!({ "machine": snap.machine, "workers": workers })
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::views::{GpuView, WorkerView};
    use crate::worker::State;

    /// An answer bigger than the sockets' buffers hold (16 MB; loopback
    /// takes ~3 MB): a client that reads takes it all; one that never reads
    /// is given up on once it took nothing for [`WRITE_STALL`] (before, the
    /// write waited for the whole connection's time, holding a place).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_that_takes_none_of_its_answer_is_given_up_on() {
        let answer = vec![b'x'; 16 << 20];
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = listener.local_addr().unwrap();
        // One that reads.
        let reader = tokio::spawn(async move {
            let mut s = TcpStream::connect(at).await.unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).await.unwrap();
            got.len()
        });
        let (mut server, _) = listener.accept().await.unwrap();
        write_answer(&mut server, &answer).await.unwrap();
        drop(server);
        assert_eq!(reader.await.unwrap(), answer.len());
        // One that never reads.
        let idle = TcpStream::connect(at).await.unwrap();
        let (mut server, _) = listener.accept().await.unwrap();
        let written =
            tokio::time::timeout(CONNECTION_TIMEOUT * 3, write_answer(&mut server, &answer))
                .await
                .expect("given up on by write_answer, not left waiting");
        assert_eq!(written.unwrap_err().kind(), std::io::ErrorKind::TimedOut);
        drop(idle);
    }

    /// The workers are gathered for a path as it is answered: decoded.
    #[test]
    fn a_page_written_with_escapes_shows_its_workers() {
        for path in [
            "/",
            "/metrics",
            "/%6Detrics",
            "/machines/m/workers",
            "/%6Dachines/m/workers",
        ] {
            assert!(shows_workers(path), "{path}");
        }
        for path in ["/nope", "/%6Eope", "/favicon.ico"] {
            assert!(!shows_workers(path), "{path}");
        }
    }

    #[test]
    fn the_host_is_read_from_the_head_alone_and_named_once() {
        let ok = "GET / HTTP/1.1\r\nhOsT: 127.0.0.1:8089\r\nAccept: */*\r\n\r\n";
        assert_eq!(host_of(ok), Ok(Some("127.0.0.1:8089")));
        assert_eq!(host_of("GET / HTTP/1.0\r\n\r\n"), Ok(None));
        let twice = "GET / HTTP/1.1\r\nHost: localhost\r\nHost: evil.example\r\n\r\n";
        assert!(host_of(twice).is_err());
        // What follows the head is not a header.
        let after = "GET / HTTP/1.1\r\nHost: localhost\r\n\r\nHost: evil.example\r\n";
        assert_eq!(host_of(after), Ok(Some("localhost")));
        // Hidden from a reader that trims, or joins folded lines.
        let spaced = "GET / HTTP/1.1\r\nHost: localhost\r\nHost : evil.example\r\n\r\n";
        assert!(host_of(spaced).is_err());
        let folded = "GET / HTTP/1.1\r\nX-A: 1\r\n Host: evil.example\r\n\r\n";
        assert!(host_of(folded).is_err());
    }

    #[test]
    fn the_host_header_must_name_this_host() {
        let hosts = Hosts {
            names: vec!["gpu-7.example.org".into()],
        };
        for ok in [
            "127.0.0.1:8089",
            "10.1.2.3",
            "[::1]:8089",
            "localhost:8089",
            "LOCALHOST",
            "gpu-7.example.org:8089",
        ] {
            assert!(hosts.allows(ok), "{ok}");
        }
        for bad in [
            "attacker.example",
            "attacker.example:8089",
            "[evil]",
            "127.0.0.1.evil.io",
        ] {
            assert!(!hosts.allows(bad), "{bad}");
        }
    }

    fn snap() -> PageSnapshot {
        PageSnapshot {
            machine: "majin".into(),
            time_zone: "UTC".into(),
            gpus: vec![GpuSnap {
                view: GpuView {
                    index: 0,
                    uuid: "GPU-a".into(),
                    mode: "shared".into(),
                    healthy: true,
                    health: "ok".into(),
                    total_gb: 8.0,
                    offered_gb: 7.0,
                    held_outside_gb: 1.0,
                    taken_gb: 2.5,
                    sharers: crate::placement::SharerMap::new_sync().insert(
                        "listen".into(),
                        crate::quantity::Amount::from_hundredths(250),
                    ),
                    summary: "shared: listen 2.5 GB — 2.5 GB taken".into(),
                    power_w: -1.0,
                    utilization_pct: 30,
                    ..GpuView::default()
                },
                offers: "offers 7 of its 8 GB (1 GB held outside Astraeus)".into(),
                used_gb: None,
            }],
            workers: vec![
                WorkerSnap {
                    view: WorkerView {
                        name: "listen".into(),
                        state: State::Running,
                        gpus: vec![(0, "GPU-a".into())],
                        gpu_used_gb: -1.0,
                        gpu_shared_gb: 2.5,
                        ..WorkerView::default()
                    },
                    owner: "alice".into(),
                    shared_gb: Some(2.5),
                    pending_reasons: Vec::new(),
                },
                WorkerSnap {
                    view: WorkerView {
                        name: "big\"<".into(),
                        state: State::Pending,
                        gpu_shared_gb: 7.5,
                        ..WorkerView::default()
                    },
                    owner: "bob".into(),
                    shared_gb: None,
                    pending_reasons: vec!["GPU 0 of majin: …".into()],
                },
            ],
            slices: vec![SliceSnap {
                template: "llama".into(),
                state: "off".into(),
                dead_time_ms: Some(1500),
                active: None,
                next: Some(SliceTriple {
                    start_ms: 0,
                    end_ms: 3_600_000,
                    ends_by: "poweroff".into(),
                }),
            }],
            counters: std::sync::Arc::new(crate::usage::UsageCounters {
                until_ms: 1_700_000_000_500,
                gpu: [(
                    ("GPU-a".to_string(), "worker".to_string()),
                    crate::usage::Counted {
                        gpu_ms: 1500,
                        energy_mj: 250,
                    },
                )]
                .into(),
                worker: [(
                    "listen".to_string(),
                    crate::usage::Counted {
                        gpu_ms: 1500,
                        energy_mj: 250,
                    },
                )]
                .into(),
            }),
        }
    }

    #[test]
    fn the_seeds_json_for_workers_and_gpus() {
        let w = workers_json(&snap());
        assert_eq!(
            w["workers"][0]["gpus"],
            json!([{"index": 0, "uuid": "GPU-a"}])
        );
        assert_eq!(w["workers"][0]["gpu_shared_gb"], json!(2.5));
        assert_eq!(w["workers"][0]["gpu_used_gb"], Value::Null);
        // Waiting, its share is said all the same.
        assert_eq!(w["workers"][1]["gpu_shared_gb"], json!(7.5));
        // Waiting: nothing used, and nothing read (as astraeusctl says it).
        assert_eq!(w["workers"][1]["gpu_used_gb"], Value::Null);
        let m = machine_json(&snap());
        assert_eq!(
            m["gpus"][0]["offers"],
            json!("offers 7 of its 8 GB (1 GB held outside Astraeus)")
        );
        assert_eq!(m["gpus"][0]["power_w"], Value::Null);
        assert_eq!(
            m["gpus"][0]["sharers"],
            json!([{"worker": "listen", "gb": 2.5}])
        );
        assert_eq!(
            m["slices"][0]["next"]["start"],
            json!("1970-01-01T00:00:00+00:00")
        );
        assert_eq!(m["slices"][0]["state"], json!("off"));
    }

    #[test]
    fn routes_and_errors() {
        let s = snap();
        assert_eq!(respond("/", &s).status, 200);
        assert!(respond("/", &s).body.contains("data-machine=\"majin\""));
        assert_eq!(respond("/machines/majin", &s).status, 200);
        assert_eq!(respond("/machines/m%61jin/workers", &s).status, 200);
        let r = respond("/machines/other", &s);
        assert_eq!(r.status, 404);
        assert!(
            r.body.contains("no machine named \\\"other\\\""),
            "{}",
            r.body
        );
        assert_eq!(respond("/machines/other/workers", &s).status, 404);
        assert_eq!(respond("/nope", &s).status, 404);
        assert_eq!(respond("/machines/majin/workers/x", &s).status, 404);
    }

    #[test]
    fn metrics_are_prometheus_text_with_escaped_labels() {
        let m = metrics(&snap());
        assert!(m.contains(
            "astraeus_gpu_memory_outside_bytes{machine=\"majin\",gpu=\"0\",uuid=\"GPU-a\"} 1073741824\n"
        ));
        assert!(m.contains(
            "astraeus_worker_share_bytes{machine=\"majin\",worker=\"listen\",gpu=\"0\",uuid=\"GPU-a\"} 2684354560\n"
        ));
        assert!(m.contains("astraeus_workers_pending{machine=\"majin\"} 1\n"));
        assert!(m.contains("astraeus_slice_active{template=\"llama\"} 0\n"));
        assert!(m.contains("astraeus_handoff_dead_time_seconds{template=\"llama\"} 1.500\n"));
        assert!(m.contains("# TYPE astraeus_worker_used_bytes gauge\n"));
        assert!(m.contains("# TYPE astraeus_gpu_seconds_total counter\n"));
        assert!(m.contains(
            "astraeus_gpu_seconds_total{machine=\"majin\",gpu=\"0\",uuid=\"GPU-a\",kind=\"worker\"} 1.500\n"
        ));
        assert!(m.contains(
            "astraeus_worker_energy_joules_total{machine=\"majin\",worker=\"listen\"} 0.250\n"
        ));
        assert!(m.contains(
            "astraeus_gpu_over_promised{machine=\"majin\",gpu=\"0\",uuid=\"GPU-a\"} 0\n"
        ));
        assert!(
            !m.contains("astraeus_worker_used_bytes{"),
            "use unknown: no sample"
        );
    }

    #[test]
    fn names_are_escaped_in_html_and_percent_decoding_is_strict() {
        assert_eq!(html_escape("a\"<b>&'"), "a&quot;&lt;b&gt;&amp;&#39;");
        assert_eq!(percent_decode("a%2Fb%zz%4"), "a/b%zz%4");
        assert_eq!(metrics::label("x\"y\\\n"), "x\\\"y\\\\\\n");
    }
}
