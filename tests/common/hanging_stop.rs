//! An engine that takes the stop call and never answers it: a unix socket
//! in front of a real engine's (podman's or dockerd's) that passes every
//! request through but `POST …/stop`, whose connection it holds open with
//! no reply. What it saw is counted, so a test can tell a stop from a kill.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

pub struct HangingStop {
    pub socket: PathBuf,
    /// Stop calls taken and left unanswered.
    pub stops: Arc<AtomicUsize>,
    /// Kill calls passed through.
    pub kills: Arc<AtomicUsize>,
}

impl HangingStop {
    /// Listens on `socket`, in front of the engine at `engine`.
    pub fn start(socket: &Path, engine: &Path) -> HangingStop {
        let _ = std::fs::remove_file(socket);
        let listener = UnixListener::bind(socket).unwrap();
        let (stops, kills) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (s, k, engine) = (stops.clone(), kills.clone(), engine.to_path_buf());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let (s, k, engine) = (s.clone(), k.clone(), engine.clone());
                std::thread::spawn(move || pass(client, &engine, &s, &k));
            }
        });
        HangingStop {
            socket: socket.to_path_buf(),
            stops,
            kills,
        }
    }

    pub fn stops(&self) -> usize {
        self.stops.load(Ordering::SeqCst)
    }

    pub fn kills(&self) -> usize {
        self.kills.load(Ordering::SeqCst)
    }
}

/// One connection: its request line read, then held (a stop) or passed on.
fn pass(mut client: UnixStream, engine: &Path, stops: &AtomicUsize, kills: &AtomicUsize) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n") {
        match client.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    let line = String::from_utf8_lossy(&head).into_owned();
    let path = line.split(' ').nth(1).unwrap_or("");
    if path.contains("/stop") {
        stops.fetch_add(1, Ordering::SeqCst);
        // Taken, never answered: the caller's own deadline must end it.
        let mut rest = [0u8; 4096];
        while client.read(&mut rest).is_ok_and(|n| n > 0) {}
        return;
    }
    if path.contains("/kill") {
        kills.fetch_add(1, Ordering::SeqCst);
    }
    let Ok(mut upstream) = UnixStream::connect(engine) else {
        return;
    };
    if upstream.write_all(&head).is_err() {
        return;
    }
    let (mut c2, mut u2) = (client.try_clone().unwrap(), upstream.try_clone().unwrap());
    let up = std::thread::spawn(move || {
        let _ = std::io::copy(&mut c2, &mut u2);
        let _ = u2.shutdown(std::net::Shutdown::Write);
    });
    let _ = std::io::copy(&mut upstream, &mut client);
    let _ = client.shutdown(std::net::Shutdown::Both);
    let _ = up.join();
}
