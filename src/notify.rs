//! Telling systemd how the daemon is (`READY=1`, `STATUS=…`, `WATCHDOG=1`,
//! `STOPPING=1`) over one socket kept open. The loop sends its status line
//! after every turn that changed it; a socket opened and closed per message
//! (what `sd_notify::notify` does) was 6 % of the loop's time under load
//! (#25, docs/benchmarks.md).

use sd_notify::NotifyState;
use std::ffi::OsString;
use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

/// The service manager's notify socket (`$NOTIFY_SOCKET`), or nothing when
/// the daemon was not started by one.
pub struct Notifier {
    path: Option<OsString>,
    sock: Option<UnixDatagram>,
    /// No socket is opened again before this: a manager that is gone (or
    /// a test that stopped listening) costs a failed connect a second at
    /// most, not two on every turn of the loop.
    retry_at: Option<Instant>,
}

/// How long after a failed connect the next is tried.
const RETRY_AFTER: Duration = Duration::from_secs(1);

impl Notifier {
    pub fn from_env() -> Notifier {
        Notifier::at(std::env::var_os("NOTIFY_SOCKET"))
    }

    pub fn at(path: Option<OsString>) -> Notifier {
        Notifier {
            path,
            sock: None,
            retry_at: None,
        }
    }

    /// Sends the states as one message. A failed send connects again once
    /// and resends (systemd re-executing binds its socket anew); errors are
    /// otherwise ignored, as with sd_notify: the daemon works without them.
    /// The socket never blocks: a manager that does not read costs a lost
    /// status line, never a stalled loop.
    pub fn send(&mut self, states: &[NotifyState]) {
        let Some(path) = &self.path else {
            return;
        };
        let msg: String = states.iter().map(|s| format!("{s}\n")).collect();
        // READY=1 and STOPPING=1 are said once: systemd gives up on a
        // start that never says ready. Those wait for room in a full queue
        // (a boot's storm of messages), for a bounded time.
        let must_arrive = states
            .iter()
            .any(|s| matches!(s, NotifyState::Ready | NotifyState::Stopping));
        for _ in 0..2 {
            if self.sock.is_none() {
                if self.retry_at.is_some_and(|at| Instant::now() < at) {
                    return;
                }
                match connect(path) {
                    Ok(sock) => self.sock = Some(sock),
                    Err(_) => {
                        self.retry_at = Some(Instant::now() + RETRY_AFTER);
                        return;
                    }
                }
            }
            let Some(sock) = &self.sock else { return };
            match send(sock, msg.as_bytes(), must_arrive) {
                // A full queue drops this message; the socket is fine.
                Ok(_) => return,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(_) => self.sock = None,
            }
        }
    }
}

/// How long READY=1 or STOPPING=1 waits for room in the manager's queue.
const MUST_ARRIVE_WITHIN: Duration = Duration::from_secs(2);

/// One message; `must_arrive` waits (boundedly) where the queue is full.
fn send(sock: &UnixDatagram, msg: &[u8], must_arrive: bool) -> std::io::Result<usize> {
    if !must_arrive {
        return sock.send(msg);
    }
    sock.set_nonblocking(false)?;
    sock.set_write_timeout(Some(MUST_ARRIVE_WITHIN))?;
    let sent = sock.send(msg);
    sock.set_nonblocking(true)?;
    sent
}

/// A datagram socket connected to `path`; `@name` is an abstract address.
fn connect(path: &OsString) -> std::io::Result<UnixDatagram> {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::net::SocketAddr;
    let sock = UnixDatagram::unbound()?;
    sock.set_nonblocking(true)?;
    match path.as_bytes().strip_prefix(b"@") {
        Some(name) => sock.connect_addr(&SocketAddr::from_abstract_name(name)?)?,
        None => sock.connect(path)?,
    }
    Ok(sock)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn bound(path: &std::path::Path) -> UnixDatagram {
        let s = UnixDatagram::bind(path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s
    }

    fn received(s: &UnixDatagram) -> String {
        let mut buf = [0u8; 256];
        let n = s.recv(&mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    /// One socket for every message, and a new one when the manager's
    /// socket was bound again (as after `systemctl daemon-reexec`).
    #[test]
    fn messages_reach_the_socket_and_a_rebound_socket_is_found_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let manager = bound(&path);
        let mut n = Notifier::at(Some(path.clone().into()));
        n.send(&[NotifyState::Ready, NotifyState::Status("0 workers")]);
        assert_eq!(received(&manager), "READY=1\nSTATUS=0 workers\n");
        n.send(&[NotifyState::Status("1 worker")]);
        assert_eq!(received(&manager), "STATUS=1 worker\n");
        drop(manager);
        std::fs::remove_file(&path).unwrap();
        let manager = bound(&path);
        n.send(&[NotifyState::Status("2 workers")]);
        assert_eq!(received(&manager), "STATUS=2 workers\n");
    }

    /// No manager listening: one failed connect, then none until a second
    /// has passed; a manager that appears meanwhile is reached after it.
    /// A manager that does not read never holds the sender.
    #[test]
    fn a_missing_manager_is_tried_again_after_a_pause_and_never_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let mut n = Notifier::at(Some(path.clone().into()));
        n.send(&[NotifyState::Status("lost")]);
        let manager = bound(&path);
        n.send(&[NotifyState::Status("within the pause")]);
        assert!(n.sock.is_none(), "no connect within the pause");
        n.retry_at = Some(Instant::now());
        n.send(&[NotifyState::Status("after the pause")]);
        assert_eq!(received(&manager), "STATUS=after the pause\n");
        // Never read: the queue fills, the sends return, the socket stays.
        for i in 0..10_000 {
            n.send(&[NotifyState::Status(&format!("{i}"))]);
        }
        assert!(n.sock.is_some());
        // READY=1 waits for room: read while it waits, and it arrives.
        let reader = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            let mut last = String::new();
            while let Ok(m) = std::panic::catch_unwind(|| received(&manager)) {
                last = m;
                if last.starts_with("READY=1") {
                    break;
                }
            }
            last
        });
        n.send(&[NotifyState::Ready]);
        assert_eq!(reader.join().unwrap(), "READY=1\n");
    }

    #[test]
    fn an_abstract_address_is_reached() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("astraeus-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let manager = UnixDatagram::bind_addr(&addr).unwrap();
        manager
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut n = Notifier::at(Some(format!("@{name}").into()));
        n.send(&[NotifyState::Stopping]);
        assert_eq!(received(&manager), "STOPPING=1\n");
    }

    #[test]
    fn without_a_manager_nothing_is_sent() {
        let mut n = Notifier::at(None);
        n.send(&[NotifyState::Ready]);
        assert!(n.sock.is_none());
    }
}
