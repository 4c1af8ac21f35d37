//! Telling systemd how the daemon is (`READY=1`, `STATUS=…`, `WATCHDOG=1`,
//! `STOPPING=1`) over one socket kept open. The loop sends its status line
//! after every turn that changed it; a socket opened and closed per message
//! (what `sd_notify::notify` does) was 6 % of the loop's time under load
//! (#25, docs/benchmarks.md).

use sd_notify::NotifyState;
use std::ffi::OsString;
use std::os::unix::net::UnixDatagram;

/// The service manager's notify socket (`$NOTIFY_SOCKET`), or nothing when
/// the daemon was not started by one.
pub struct Notifier {
    path: Option<OsString>,
    sock: Option<UnixDatagram>,
}

impl Notifier {
    pub fn from_env() -> Notifier {
        Notifier::at(std::env::var_os("NOTIFY_SOCKET"))
    }

    pub fn at(path: Option<OsString>) -> Notifier {
        Notifier { path, sock: None }
    }

    /// Sends the states as one message. A failed send connects again once
    /// and resends (systemd re-executing binds its socket anew); errors are
    /// otherwise ignored, as with sd_notify: the daemon works without them.
    pub fn send(&mut self, states: &[NotifyState]) {
        let Some(path) = &self.path else {
            return;
        };
        let msg: String = states.iter().map(|s| format!("{s}\n")).collect();
        for _ in 0..2 {
            if self.sock.is_none() {
                self.sock = connect(path).ok();
            }
            match &self.sock {
                Some(sock) if sock.send(msg.as_bytes()).is_ok() => return,
                _ => self.sock = None,
            }
        }
    }
}

/// A datagram socket connected to `path`; `@name` is an abstract address.
fn connect(path: &OsString) -> std::io::Result<UnixDatagram> {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::net::SocketAddr;
    let sock = UnixDatagram::unbound()?;
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
