//! The page's places: how many connections each client address holds, the
//! places waiting for the service loop, and the answer to a connection that
//! gets none. Fair to every address (#63): one address's flood takes no
//! more than its share, so another's request is still answered.

use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub(super) const MAX_CONNECTIONS: usize = 64;
/// Of those, one client address holds at most this many: 80 slow readers
/// from one address held every place, and another address's request got
/// 503 or waited seconds (#63).
pub(super) const MAX_PER_ADDRESS: usize = 16;
/// A head still being read after this long is slow: its place may go to
/// a newcomer of the same address.
pub(super) const SLOW_HEAD: Duration = Duration::from_millis(500);
/// Connections still reading their request head, oldest first: when all
/// places are taken, the slowest of these is dropped for the newcomer, so
/// slow clients cannot hold the page (and accepting never waits).
#[derive(Default)]
pub(super) struct Reading {
    pub(super) open: usize,
    pub(super) heads:
        std::collections::VecDeque<(u64, tokio::task::AbortHandle, std::time::Instant)>,
    /// Places each client address holds.
    pub(super) by_address: std::collections::HashMap<std::net::IpAddr, usize>,
    /// Every connection's task, by id, with its address: when all places
    /// are taken by connections past their heads, a newcomer from an
    /// address holding fewer takes one of the address holding the most.
    pub(super) all: std::collections::HashMap<u64, (std::net::IpAddr, tokio::task::AbortHandle)>,
}

/// Connections being told they get no place, at most [`MAX_REFUSING`]
/// at once (more are closed unanswered).
pub(super) static REFUSING: tokio::sync::Semaphore =
    tokio::sync::Semaphore::const_new(MAX_REFUSING);
pub(super) const MAX_REFUSING: usize = 64;

/// Answers a connection that gets no place, in a task of at most a
/// second: the answer written, the connection shut for writing, and what
/// the client still sends read until it closes (a close with unread bytes
/// would reset the connection before the answer is read).
pub(super) fn refuse(mut stream: TcpStream, answer: &'static str) {
    let Ok(told) = REFUSING.try_acquire() else {
        return;
    };
    tokio::spawn(async move {
        let _told = told;
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            stream.write_all(answer.as_bytes()).await?;
            stream.shutdown().await?;
            let mut sink = [0u8; 4096];
            while stream.read(&mut sink).await? > 0 {}
            std::io::Result::Ok(())
        })
        .await;
    });
}

impl Reading {
    /// The oldest connection of `from` still reading its head after
    /// [`SLOW_HEAD`], taken off the list (a burst of requests whose heads
    /// are on their way takes none of its own).
    pub(super) fn slowest_head_of(
        &mut self,
        from: std::net::IpAddr,
    ) -> Option<tokio::task::AbortHandle> {
        let at = self.heads.iter().position(|(id, _, since)| {
            since.elapsed() >= SLOW_HEAD && self.all.get(id).is_some_and(|(a, _)| *a == from)
        })?;
        self.heads.remove(at).map(|(_, task, _)| task)
    }

    /// The place to free for a newcomer from `from` when every place is
    /// taken: the slowest head still being read, else (fair shares) the
    /// newest connection of the address holding the most places, when it
    /// holds more than `from` would with this one.
    pub(super) fn place_for(&mut self, from: std::net::IpAddr) -> Option<tokio::task::AbortHandle> {
        if let Some((_, slow, _)) = self.heads.pop_front() {
            return Some(slow);
        }
        let mine = self.by_address.get(&from).copied().unwrap_or(0);
        let (&most, &held) = self.by_address.iter().max_by_key(|(_, n)| **n)?;
        if held <= mine + 1 {
            return None;
        }
        let (&id, _) = self
            .all
            .iter()
            .filter(|(_, (a, _))| *a == most)
            .max_by_key(|(id, _)| **id)?;
        self.all.remove(&id).map(|(_, task)| task)
    }
}

/// A connection's place, given back however its task ends (even aborted).
pub(super) struct Place {
    pub(super) id: u64,
    pub(super) from: std::net::IpAddr,
    pub(super) reading: Arc<std::sync::Mutex<Reading>>,
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut r = self.reading.lock().unwrap_or_else(|e| e.into_inner());
        r.open -= 1;
        r.heads.retain(|(i, _, _)| *i != self.id);
        r.all.remove(&self.id);
        if let Some(n) = r.by_address.get_mut(&self.from) {
            *n -= 1;
            if *n == 0 {
                r.by_address.remove(&self.from);
            }
        }
    }
}

/// The answer to a connection beyond its address's share of places.
pub(super) const TOO_MANY_FROM_ADDRESS: &str = "HTTP/1.1 503 Service Unavailable\r\n\
    Content-Type: text/plain; charset=utf-8\r\nContent-Length: 58\r\n\
    Connection: close\r\nRetry-After: 1\r\n\r\n\
    too many connections from your address at once; try again\n";

/// At most this many page requests wait for the service loop at once: the
/// page (any local user) takes no more of its queue than a bus client may;
/// one client address at most half of that, so another's is still taken.
pub(super) const PAGE_IN_QUEUE: usize = crate::bus::PER_CLIENT_IN_FLIGHT;
pub(super) const PAGE_IN_QUEUE_PER_ADDRESS: usize = PAGE_IN_QUEUE / 2;
pub(super) static WAITING: tokio::sync::Semaphore =
    tokio::sync::Semaphore::const_new(PAGE_IN_QUEUE);
pub(super) static WAITING_BY_ADDRESS: std::sync::Mutex<
    Option<std::collections::HashMap<std::net::IpAddr, usize>>,
> = std::sync::Mutex::new(None);

/// One of an address's places waiting for the loop, given back when dropped.
pub(super) struct AddressWaits(std::net::IpAddr);

impl AddressWaits {
    pub(super) fn take(from: std::net::IpAddr) -> Option<AddressWaits> {
        let mut all = WAITING_BY_ADDRESS.lock().unwrap_or_else(|e| e.into_inner());
        let n = all
            .get_or_insert_with(Default::default)
            .entry(from)
            .or_default();
        if *n >= PAGE_IN_QUEUE_PER_ADDRESS {
            return None;
        }
        *n += 1;
        Some(AddressWaits(from))
    }
}

impl Drop for AddressWaits {
    fn drop(&mut self) {
        let mut all = WAITING_BY_ADDRESS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(all) = all.as_mut() {
            if let Some(n) = all.get_mut(&self.0) {
                *n -= 1;
                if *n == 0 {
                    all.remove(&self.0);
                }
            }
        }
    }
}
