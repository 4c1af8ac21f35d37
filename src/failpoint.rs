//! Named failpoints for crash and watchdog tests.
//!
//! `ASTRAEUS_FAILPOINTS="name=kill@3,other=block,third=pause1500"` makes the
//! process SIGKILL itself on the third time it reaches `name`, block forever
//! at `other`, and hold the thread at `third` for 1.5 s (the first time).
//! `name=fail@2` makes the second [`fails`] at `name` report a failure.
//! `name=pause1000@all` holds the thread 1 s at every hit (a slow operation).
//! Without the variable every `hit` is one relaxed load of an empty table.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

enum Action {
    Kill,
    Block,
    /// Milliseconds.
    Pause(u64),
    /// [`fails`] says yes.
    Fail,
}

struct Point {
    action: Action,
    /// Fire on this hit (1-based); 0: on every hit.
    on: u32,
    hits: AtomicU32,
}

fn table() -> &'static HashMap<String, Point> {
    static TABLE: OnceLock<HashMap<String, Point>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let spec = std::env::var("ASTRAEUS_FAILPOINTS").unwrap_or_default();
        spec.split(',')
            .filter_map(|entry| {
                let (name, rest) = entry.trim().split_once('=')?;
                let (action, on) = match rest.split_once('@') {
                    Some((a, "all")) => (a, 0),
                    Some((a, n)) => (a, n.parse().ok()?),
                    None => (rest, 1),
                };
                let action = match action {
                    "kill" => Action::Kill,
                    "block" => Action::Block,
                    "fail" => Action::Fail,
                    other => Action::Pause(other.strip_prefix("pause")?.parse().ok()?),
                };
                Some((
                    name.to_string(),
                    Point {
                        action,
                        on,
                        hits: AtomicU32::new(0),
                    },
                ))
            })
            .collect()
    })
}

/// [`hit`] from a task on tokio's runtime. A point that pauses holds its
/// thread, and tokio would keep that worker's next task (its LIFO slot,
/// which other workers cannot steal) waiting with it: a submit sent while a
/// listing is held timed out that way in one CI run. `block_in_place` hands
/// that worker's tasks to another first, so that only this task is held, as
/// a long computation in it would be.
pub fn hit_in_task(name: &str) {
    if !table().contains_key(name) {
        return;
    }
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(|| hit(name))
        }
        _ => hit(name),
    }
}

/// [`hit`] in a task on the thread the loop and the bus share: a pause or
/// a block holds this task only (as a slow caller would be held), not the
/// thread.
pub async fn hit_async(name: &str) {
    match reached(name).map(|p| &p.action) {
        Some(Action::Pause(ms)) => tokio::time::sleep(std::time::Duration::from_millis(*ms)).await,
        Some(Action::Block) => std::future::pending().await,
        Some(action) => act(action),
        None => {}
    }
}

/// The point named, when this hit is the one it fires on.
fn reached(name: &str) -> Option<&'static Point> {
    let p = table().get(name)?;
    if !fires(p) {
        return None;
    }
    // A test waits for this line to know the process is held here.
    tracing::warn!("failpoint {name} reached");
    Some(p)
}

/// Counts a hit of `p`; whether it fires on this one.
fn fires(p: &Point) -> bool {
    let hit = p.hits.fetch_add(1, Ordering::SeqCst) + 1;
    p.on == 0 || hit == p.on
}

/// Marks a point where a test may kill or stall the process.
pub fn hit(name: &str) {
    if let Some(p) = reached(name) {
        act(&p.action);
    }
}

fn act(action: &Action) {
    match *action {
        // SIGKILL, not abort: no destructor, no flush, exactly like a power cut
        // as far as the process is concerned.
        Action::Kill => unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        },
        Action::Block => loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        },
        Action::Pause(ms) => std::thread::sleep(std::time::Duration::from_millis(ms)),
        Action::Fail => {}
    }
}

/// Whether a test asked the operation at this point to fail now
/// (`name=fail@N`): the caller then fails as if it had, e.g. a commit as
/// on a full disk.
pub fn fails(name: &str) -> bool {
    let Some(p) = table().get(name) else {
        return false;
    };
    if !matches!(p.action, Action::Fail) || !fires(p) {
        return false;
    }
    tracing::warn!("failpoint {name} reached");
    true
}
