//! Careless and hostile input over the bus: refused with typed errors naming
//! the field, and the daemon's memory does not grow.

mod common;
use common::*;

/// Calls a Manager method with one string through zbus (busctl and gdbus cannot
/// carry 10 MB on their command lines); the error's name and message.
fn call(
    rt: &tokio::runtime::Runtime,
    conn: &zbus::Connection,
    method: &str,
    spec: &str,
) -> Result<(), (String, String)> {
    rt.block_on(manager_call(conn, method, spec))
        .map(|_| ())
        .map_err(|e| match e {
            zbus::Error::MethodError(name, msg, _) => (name.to_string(), msg.unwrap_or_default()),
            other => ("other".to_string(), other.to_string()),
        })
}

/// A Manager method taking one spec, called with zbus from this process
/// (busctl cannot send 30 MiB).
async fn manager_call(
    conn: &zbus::Connection,
    method: &str,
    spec: &str,
) -> zbus::Result<zbus::Message> {
    conn.call_method(
        Some("org.astraeus.Node1"),
        "/org/astraeus/Node1",
        Some("org.astraeus.Node1.Manager"),
        method,
        &(spec,),
    )
    .await
}

/// A member of `astraeus` (created when missing; the suite runs as root to
/// run clients as other users), a temp dir, and majin's sim file in it.
fn member_and_majin() -> (&'static str, tempfile::TempDir, std::path::PathBuf) {
    assert!(
        is_root(),
        "run the suite as root (as CI does): it runs clients as other users"
    );
    let member = "astraeus-test-a";
    ensure_user(member);
    let dir = open_tempdir();
    let sim = dir.path().join("majin.toml");
    std::fs::write(&sim, MAJIN_TOML).unwrap();
    (member, dir, sim)
}

/// CPU time a process used so far, in clock ticks (user + system).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let Some(end) = stat.rfind(')') else {
        return 0;
    };
    stat[end + 2..]
        .split(' ')
        .skip(11)
        .take(2)
        .map(|v| v.parse::<u64>().unwrap_or(0))
        .sum()
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// A name no worker could have, given to GetWorker or StopWorker, is told
/// as such (the field named) and never echoed: another user's terminal
/// escape or a 200 KB name does not come back in the error.
#[test]
fn names_no_worker_could_have_are_refused_and_not_echoed() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let _d = start_majin(&bus, dir.path(), "", &[]);
    let (rt, conn) = blocking_client(&bus.address);
    let long = "x".repeat(200_000);
    for name in ["\u{1b}]0;owned\u{7}", long.as_str(), "a\u{202e}b"] {
        for method in ["GetWorker", "StopWorker"] {
            let (error, msg) = call(&rt, &conn, method, name).expect_err("refused");
            assert_eq!(error, "org.astraeus.Node1.Error.InvalidRequest", "{msg}");
            assert!(msg.starts_with("name: 1 to 64 characters"), "{msg}");
            assert!(msg.len() < 200, "{method} echoed the name back");
        }
    }
    // A name a worker could have, with none by it: NotFound, as before.
    let (error, _) = call(&rt, &conn, "GetWorker", "nobody-here").expect_err("none");
    assert_eq!(error, "org.astraeus.Node1.Error.NotFound");
}

#[test]
fn oversized_and_malformed_requests_get_typed_errors_and_cost_no_memory() {
    let dir = open_tempdir();
    let sim = dir.path().join("majin.toml");
    std::fs::write(&sim, MAJIN_TOML).unwrap();
    let bus = Bus::session();
    // Two malloc arenas: what stays resident then reflects what is kept, not
    // how many threads happened to allocate.
    let d = Daemon::start(&bus, dir.path(), &sim, &[("MALLOC_ARENA_MAX", "2")]);
    let a = &bus.address;
    let pid = d.child.id();

    let ten_mb = format!(r#"{{"name":"big","pad":"{}"}}"#, "x".repeat(10 << 20));
    let holders: Vec<u32> = (1..=100_000).collect();
    let many = serde_json::json!({"name": "many", "holders": holders}).to_string();
    let models: Vec<String> = (0..300).map(|i| format!("m{i}")).collect();
    let long_list = serde_json::json!({"name": "long", "requested_resources": {"gpu_requests": {"models": models}}}).to_string();
    let cases: Vec<(String, &str)> = vec![
        (ten_mb, "request: "),
        (many, "request: "),
        (long_list, "requested_resources.gpu_requests.models: 300 elements is too many"),
        (serde_json::json!({"name": "n".repeat(1000)}).to_string(), "name: 1 to 64 characters"),
        (serde_json::json!({"name": "a/b"}).to_string(), "name: 1 to 64 characters"),
        (serde_json::json!({"name": "a\u{0}b"}).to_string(), "name: must not contain a NUL character"),
        (serde_json::json!({"name": "a\u{7}b"}).to_string(), "name: 1 to 64 characters"),
        (serde_json::json!({"name": "ok", "requested_resources": {"gpu_requests": {"vendor": "nv\u{0}idia"}}}).to_string(), "requested_resources.gpu_requests.vendor: must not contain a NUL"),
        // What another user reads back in a reason or a table.
        (serde_json::json!({"name": "ok", "requested_resources": {"gpu_requests": {"ids": ["GPU-\u{1b}]0;x\u{7}\nrootjob  running"]}}}).to_string(), "requested_resources.gpu_requests.ids[0]: a GPU index"),
        (serde_json::json!({"name": "ok", "requested_resources": {"gpu_requests": {"models": ["4060\u{202e}"]}}}).to_string(), "requested_resources.gpu_requests.models[0]: 1 to 128 printable"),
        (serde_json::json!({"name": "ok", "holders": [7, 7]}).to_string(), "holders[1]: process 7 is named already"),
        (serde_json::json!({"name": "ok", "a\u{200b}": 1}).to_string(), "(a field name): unknown field"),
        ("{\"name\":".to_string(), "request: not valid JSON"),
        ("[]".to_string(), "request: expected a JSON object"),
    ];
    let (rt, conn) = blocking_client(a);
    // Warm up (the allocator keeps some freed memory for reuse), then measure
    // across many more refusals: a leak grows with them, reuse does not.
    for _ in 0..5 {
        for (spec, _) in &cases {
            let _ = call(&rt, &conn, "WhyNot", spec);
        }
    }
    let before = rss_kib(pid);
    for round in 0..20 {
        for (spec, expected) in &cases {
            let method = if round % 2 == 0 {
                "SubmitWorker"
            } else {
                "WhyNot"
            };
            let (name, msg) = call(&rt, &conn, method, spec).expect_err("refused");
            assert_eq!(name, "org.astraeus.Node1.Error.InvalidRequest", "{msg}");
            assert!(msg.contains(expected), "{expected:?} not in {msg}");
        }
    }
    // The CLI tools see the same typed error.
    let o = gdbus(
        a,
        &[
            "-o",
            "/org/astraeus/Node1",
            "-m",
            "org.astraeus.Node1.Manager.SubmitWorker",
            &cases[3].0,
        ],
    );
    assert!(
        o.stderr.contains("org.astraeus.Node1.Error.InvalidRequest"),
        "{}",
        o.stderr
    );
    // The last big request's buffers may still be in flight: take the lowest
    // of a few readings.
    let after = (0..5)
        .map(|_| {
            std::thread::sleep(std::time::Duration::from_millis(200));
            rss_kib(pid)
        })
        .min()
        .unwrap();
    eprintln!("resident memory: {before} KiB before, {after} KiB after");
    // Twenty 10 MB requests went through: a leak of even one copy each would
    // be 200 MB; the allocator settling stays well under three of them.
    assert!(
        after < before + 32 * 1024,
        "resident memory grew from {before} KiB to {after} KiB"
    );
    // Nothing was half-applied.
    assert_eq!(
        manager(a, None, "ListWorkers", &[]).stdout.trim(),
        "a(ssusdaud) 0"
    );
}

/// One call's outcome (Ok, or the error's name) and how long it took.
async fn timed(conn: &zbus::Connection, method: &str) -> (Result<(), String>, std::time::Duration) {
    let t = std::time::Instant::now();
    let r = conn
        .call_method(
            Some("org.astraeus.Node1"),
            "/org/astraeus/Node1",
            Some("org.astraeus.Node1.Manager"),
            method,
            &(),
        )
        .await;
    let outcome = match r {
        Ok(_) => Ok(()),
        Err(zbus::Error::MethodError(name, msg, _)) => {
            Err(format!("{name}: {}", msg.unwrap_or_default()))
        }
        Err(e) => Err(e.to_string()),
    };
    (outcome, t.elapsed())
}

#[test]
fn a_flooding_client_does_not_starve_another() {
    let dir = open_tempdir();
    let sim = dir.path().join("majin.toml");
    std::fs::write(&sim, MAJIN_TOML).unwrap();
    let bus = Bus::session();
    let _d = Daemon::start(&bus, dir.path(), &sim, &[]);
    let a = bus.address.clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (flood_ok, flood_busy, lat) = rt.block_on(async move {
        let connect = || zbus::connection::Builder::address(a.as_str()).build();
        let flooder = connect().await.unwrap();
        let quiet = connect().await.unwrap();
        // Alone first: the quiet client's latency without a flood.
        let mut alone = Vec::new();
        for _ in 0..30 {
            alone.push(timed(&quiet, "ListGpus").await.1);
        }
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut tasks = Vec::new();
        for _ in 0..300 {
            let (c, stop) = (flooder.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                let (mut ok, mut busy) = (0u32, 0u32);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    match timed(&c, "ListGpus").await.0 {
                        Ok(()) => ok += 1,
                        // Refused for its client's limit (16 waiting), and only that.
                        Err(e)
                            if e.starts_with(
                                "org.astraeus.Node1.Error.Busy: 16 calls of this client are already waiting",
                            ) =>
                        {
                            busy += 1
                        }
                        Err(e) => panic!("a flooding call failed otherwise than Busy: {e}"),
                    }
                }
                (ok, busy)
            }));
        }
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let mut under = Vec::new();
        for _ in 0..50 {
            let (ok, took) = timed(&quiet, "ListGpus").await;
            assert_eq!(ok, Ok(()), "the quiet client was refused under the flood");
            under.push(took);
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let (mut ok, mut busy) = (0, 0);
        for t in tasks {
            let (o, b) = t.await.unwrap();
            ok += o;
            busy += b;
        }
        alone.sort();
        under.sort();
        (ok, busy, (alone[15], under[25], under[49]))
    });
    eprintln!(
        "flood: {flood_ok} calls answered, {flood_busy} refused Busy; quiet client p50 {:?} alone, \
         p50 {:?} and max {:?} under the flood",
        lat.0, lat.1, lat.2
    );
    assert!(
        flood_busy > 0,
        "300 concurrent calls of one client must meet its limit"
    );
    assert!(flood_ok > 0);
}

/// This test binary re-executed as nobody, running only `test` (a flooder
/// that acts when `env` is set, the bus address its value).
fn as_nobody(test: &str, env: &str, address: &str, stdout: std::process::Stdio) -> AsUser {
    as_user("nobody", test, env, address, stdout)
}

/// A flooder run as another user, killed when dropped: a failed assertion
/// must not leave it flooding (and eating the CPU) under the tests after.
struct AsUser(std::process::Child);

impl std::ops::Deref for AsUser {
    type Target = std::process::Child;
    fn deref(&self) -> &std::process::Child {
        &self.0
    }
}

impl std::ops::DerefMut for AsUser {
    fn deref_mut(&mut self) -> &mut std::process::Child {
        &mut self.0
    }
}

impl Drop for AsUser {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// [`as_nobody`] as `user`, in its group (nogroup for nobody, astraeus for
/// the users [`ensure_user`] makes).
fn as_user(
    user: &str,
    test: &str,
    env: &str,
    address: &str,
    stdout: std::process::Stdio,
) -> AsUser {
    let group = if user == "nobody" {
        "nogroup"
    } else {
        "astraeus"
    };
    AsUser(
        std::process::Command::new("setpriv")
            .args([
                &format!("--reuid={user}"),
                &format!("--regid={group}"),
                "--clear-groups",
            ])
            .arg(std::env::current_exe().unwrap())
            .args(["--exact", test, "--nocapture"])
            .env(env, address)
            .stdout(stdout)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// A flooder's runtime: two workers, so its calls go out while others wait.
fn flooder_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Run by `a_user_flooding_from_many_connections_leaves_room_for_others` as
/// another user (this binary, re-executed under setpriv): 40 connections,
/// each keeping 16 ListGpus calls in flight, until killed; prints each
/// refusal's text once. Does nothing in a normal run.
#[test]
fn flooder_of_connections() {
    let Ok(address) = std::env::var("ASTRAEUS_TEST_CONNECTIONS_ADDRESS") else {
        return;
    };
    let said = std::sync::Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    flood(&address, 40, 16, move |conn| {
        let said = said.clone();
        async move {
            if let Err(e) = timed(&conn, "ListGpus").await.0 {
                if said.lock().unwrap().insert(e.clone()) {
                    println!("REFUSED {e}");
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    });
}

/// A flooder's body: `connections` connections to `address`, each keeping
/// `each` calls of `call` in flight, again and again, until killed.
fn flood<F, Fut>(address: &str, connections: usize, each: usize, call: F)
where
    F: Fn(zbus::Connection) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    flooder_runtime().block_on(async move {
        let mut tasks = Vec::new();
        for _ in 0..connections {
            let conn = zbus::connection::Builder::address(address)
                .build()
                .await
                .unwrap();
            for _ in 0..each {
                let (conn, call) = (conn.clone(), call.clone());
                tasks.push(tokio::spawn(async move {
                    loop {
                        call(conn.clone()).await;
                    }
                }));
            }
        }
        for t in tasks {
            let _ = t.await;
        }
    });
}

/// A daemon on a system-like bus with the shipped policy, its loop held
/// 15 s by a ListGpus (a failpoint): the bus, the daemon, and the call
/// holding it.
fn loop_held_15s(
    dir: &tempfile::TempDir,
    sim: &std::path::Path,
) -> (Bus, Daemon, std::thread::JoinHandle<Out>) {
    let bus = Bus::system_like(dir.path(), Some(policy_file()));
    let d = Daemon::start(
        &bus,
        dir.path(),
        sim,
        &[("ASTRAEUS_FAILPOINTS", "service.list-gpus=pause15000")],
    );
    let holder = {
        let a = bus.address.clone();
        std::thread::spawn(move || manager(&a, None, "ListGpus", &[]))
    };
    eventually("the loop held", || {
        d.log_text().contains("failpoint service.list-gpus reached")
    });
    (bus, d, holder)
}

/// One user (nobody) opens 40 connections and keeps 16 calls in flight on
/// each while the loop is held (a failpoint, 15 s): 640 calls, more than the
/// loop's queue (256). Each client's own bound (16) let them fill it, and a
/// member's call was refused Busy. Each user's calls over all its
/// connections are bounded too (64): the member's call waits its turn and
/// is answered, and the flood is told why it was refused.
#[test]
fn a_user_flooding_from_many_connections_leaves_room_for_others() {
    let (member, dir, sim) = member_and_majin();
    let (bus, _d, holder) = loop_held_15s(&dir, &sim);
    let a = bus.address.clone();
    let out = dir.path().join("flooder.out");
    let mut flooder = as_nobody(
        "flooder_of_connections",
        "ASTRAEUS_TEST_CONNECTIONS_ADDRESS",
        &a,
        std::fs::File::create(&out).unwrap().into(),
    );
    eventually("the flood refused", || {
        std::fs::read_to_string(&out)
            .unwrap_or_default()
            .contains("REFUSED")
    });
    // Still held: the member's call meets the flood's queue.
    assert!(!holder.is_finished(), "the flood took longer than the hold");
    let o = manager(&a, Some(member), "ListGpus", &[]);
    let _ = flooder.kill();
    let _ = flooder.wait();
    assert!(holder.join().unwrap().ok);
    let refused = std::fs::read_to_string(&out).unwrap();
    assert!(
        o.ok,
        "a member's call under another user's flood: {}\nthe flood was told: {refused}",
        o.stderr
    );
    let nobody = std::process::Command::new("id")
        .args(["-u", "nobody"])
        .output()
        .unwrap()
        .stdout;
    let nobody = String::from_utf8_lossy(&nobody).trim().to_string();
    assert!(
        refused.contains(&format!(
            "org.astraeus.Node1.Error.Busy: 64 calls of this user (uid {nobody}) are already \
             waiting, its share of the daemon's queue now"
        )),
        "{refused}"
    );
}

/// Two users flood at once (nobody and another user, 40 connections each,
/// 16 calls in flight on each), the loop held: the calls made before the
/// queue was half full count for no user, and a quarter each of it then
/// filled the queue, so that a member's call was refused. Now each user's
/// share is half of what the others leave.
#[test]
fn two_users_flooding_leave_room_for_a_third() {
    let (member, dir, sim) = member_and_majin();
    let (bus, _d, holder) = loop_held_15s(&dir, &sim);
    let a = bus.address.clone();
    let second = "astraeus-test-b";
    ensure_user(second);
    let outs = [dir.path().join("nobody.out"), dir.path().join("second.out")];
    let flooders: Vec<AsUser> = ["nobody", second]
        .iter()
        .zip(&outs)
        .map(|(user, out)| {
            as_user(
                user,
                "flooder_of_connections",
                "ASTRAEUS_TEST_CONNECTIONS_ADDRESS",
                &a,
                std::fs::File::create(out).unwrap().into(),
            )
        })
        .collect();
    eventually("both floods refused", || {
        outs.iter().all(|out| {
            std::fs::read_to_string(out)
                .unwrap_or_default()
                .contains("REFUSED")
        })
    });
    assert!(
        !holder.is_finished(),
        "the floods took longer than the hold"
    );
    let o = manager(&a, Some(member), "ListGpus", &[]);
    drop(flooders);
    assert!(holder.join().unwrap().ok);
    let told: Vec<String> = outs
        .iter()
        .map(|out| std::fs::read_to_string(out).unwrap())
        .collect();
    assert!(
        o.ok,
        "a member's call under two users' floods: {}\nthe floods were told: {told:?}",
        o.stderr
    );
}

/// A costly read the flooder and the member both ask for: a year's usage
/// report, or the list of workers.
async fn costly_read(conn: &zbus::Connection, method: &str) -> zbus::Result<zbus::Message> {
    let (path, iface) = ("/org/astraeus/Node1", Some("org.astraeus.Node1.Manager"));
    let dest = Some("org.astraeus.Node1");
    match method {
        "UsageReport" => {
            let body = (0i64, 365 * 86_400i64, "worker");
            conn.call_method(dest, path, iface, method, &body).await
        }
        _ => conn.call_method(dest, path, iface, method, &()).await,
    }
}

/// Run by `one_users_costly_reads_wait_their_turn_behind_anothers` as
/// another user (this binary, re-executed under setpriv): 3 connections,
/// each keeping 3 of the costly read named in
/// ASTRAEUS_TEST_READS_METHOD in flight, until killed; prints a line for
/// each answer. Does nothing in a normal run.
#[test]
fn flooder_of_costly_reads() {
    let Ok(address) = std::env::var("ASTRAEUS_TEST_READS_ADDRESS") else {
        return;
    };
    let method = std::env::var("ASTRAEUS_TEST_READS_METHOD").unwrap();
    flood(&address, 3, 3, move |conn| {
        let method = method.clone();
        async move {
            match costly_read(&conn, &method).await {
                Ok(_) => println!("ANSWERED"),
                Err(e) => println!("REFUSED {e}"),
            }
        }
    });
}

/// One user (nobody) keeps 9 costly reads in flight from 3 connections,
/// each read held 2 s by a failpoint (as a year of ledger or 100,000
/// workers would hold it). Built one at a time in the order they came, a
/// member's one read waited for all of them (16 s and more; with more
/// connections, past the bus's 25 s timeout). Turns now go round the users: it
/// waits for the read running and at most one more of the flood's.
fn one_users_costly_reads_wait_their_turn_behind_anothers(
    method: &str,
    args: &[&str],
    failpoint: &str,
) {
    let (member, dir, sim) = member_and_majin();
    let bus = Bus::system_like(dir.path(), Some(policy_file()));
    let d = Daemon::start(
        &bus,
        dir.path(),
        &sim,
        &[("ASTRAEUS_FAILPOINTS", &format!("{failpoint}=pause2000@all"))],
    );
    let a = bus.address.clone();
    let out = dir.path().join("flooder.out");
    let mut flooder = std::process::Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", "flooder_of_costly_reads", "--nocapture"])
        .env("ASTRAEUS_TEST_READS_ADDRESS", &a)
        .env("ASTRAEUS_TEST_READS_METHOD", method)
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let answered = || {
        std::fs::read_to_string(&out)
            .unwrap_or_default()
            .matches("ANSWERED")
            .count()
    };
    // Two answered: the flood's reads are all queued by now.
    eventually("the flood's reads answered in turn", || answered() >= 2);
    let before = answered();
    let mine = manager(&a, Some(member), method, args);
    let between = answered() - before;
    let _ = flooder.kill();
    let _ = flooder.wait();
    drop(d);
    let flood = std::fs::read_to_string(&out).unwrap();
    assert!(mine.ok, "the member's {method}: {}", mine.stderr);
    assert!(!flood.contains("REFUSED"), "{flood}");
    assert!(
        between <= 3,
        "{between} of the flood's reads were answered while the member's one waited"
    );
}

#[test]
fn one_users_usage_reports_wait_their_turn_behind_anothers() {
    let year = (365 * 86_400).to_string();
    one_users_costly_reads_wait_their_turn_behind_anothers(
        "UsageReport",
        &["xxs", "0", &year, "worker"],
        "usage.report",
    );
}

#[test]
fn one_users_listings_wait_their_turn_behind_anothers() {
    one_users_costly_reads_wait_their_turn_behind_anothers("ListWorkers", &[], "bus.listing");
}

/// Costly reads whose callers gave up while waiting for their turn are not
/// built (#68): zbus runs a handler to its end whether anyone still waits
/// or not, and under a flood of slow listings (a busy host, 20,000
/// workers) nearly every one was built for a busctl that had timed out,
/// while the live callers' timed out behind them. Here each listing is held
/// 3 s; four callers that leave after 1 s queue behind the first, then one
/// that stays. Counted by the failpoint's own log line (one per listing
/// built), not by a clock: the first and the staying one are built, the
/// four that left are not (6 without the check).
#[test]
fn a_costly_read_whose_caller_left_is_not_built() {
    let (_member, dir, sim) = member_and_majin();
    let bus = Bus::system_like(dir.path(), Some(policy_file()));
    let d = Daemon::start(
        &bus,
        dir.path(),
        &sim,
        &[("ASTRAEUS_FAILPOINTS", "bus.listing=pause3000@all")],
    );
    let a = bus.address.clone();
    let listing = |timeout: &str| {
        std::process::Command::new("setpriv")
            .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
            .args([
                "busctl",
                &format!("--address={a}"),
                &format!("--timeout={timeout}"),
            ])
            .args(["call", "org.astraeus.Node1", "/org/astraeus/Node1"])
            .args(["org.freedesktop.DBus.ObjectManager", "GetManagedObjects"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let built = || {
        d.log_text()
            .matches("failpoint bus.listing reached")
            .count()
    };
    let first = listing("30");
    eventually("the first listing is being built", || built() == 1);
    let leavers: Vec<_> = (0..4).map(|_| listing("1")).collect();
    for l in leavers {
        let o = l.wait_with_output().unwrap();
        assert!(
            !o.status.success(),
            "a caller that left was answered within 1 s"
        );
    }
    let stays = listing("60").wait_with_output().unwrap();
    assert!(
        stays.status.success(),
        "{}",
        String::from_utf8_lossy(&stays.stderr)
    );
    assert!(first.wait_with_output().unwrap().status.success());
    assert_eq!(
        built(),
        2,
        "listings built: the first and the one whose caller stayed, none for the four that left"
    );
}

/// The ledger holds run specs with their secrets: whatever starts the
/// daemon (here: not systemd, and a state directory left 0755 with a 0644
/// ledger by an older version), its state is its own.
#[test]
fn the_state_directory_and_ledger_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = open_tempdir();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(state.join("ledger.db"), b"").unwrap();
    std::fs::set_permissions(
        state.join("ledger.db"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let bus = Bus::session();
    let d = start_majin(&bus, dir.path(), "", &[]);
    let spec =
        r#"{"name":"w","requested_resources":{"gpu_requests":{"shared":true,"memory_gb":1}}}"#;
    assert!(manager(&bus.address, None, "SubmitWorker", &["s", spec]).ok);
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&d.state), 0o700, "state directory");
    for name in ["ledger.db", "ledger.db-wal", "ledger.db-shm"] {
        let p = d.state.join(name);
        assert!(p.exists(), "{name} (the ledger runs in WAL mode)");
        assert_eq!(mode(&p), 0o600, "{name}");
    }
}

/// `n` pending workers of 1 GB behind a 7 GB one that fills majin's GPU,
/// written into a fresh ledger in one transaction (submitting them one by
/// one would take minutes and test nothing more).
fn seed_pending(state: &std::path::Path, n: usize) {
    std::fs::create_dir_all(state).unwrap();
    drop(astraeusd::store::Store::open(&state.join("ledger.db")).unwrap());
    let mut db = rusqlite::Connection::open(state.join("ledger.db")).unwrap();
    let tx = db.transaction().unwrap();
    let add = |name: &str, gb: u32| {
        let spec = format!(
            r#"{{"name":"{name}","requested_resources":{{"gpu_requests":{{"shared":true,"memory_gb":{gb}}}}}}}"#
        );
        tx.execute(
            "INSERT INTO workers (name, spec, owner_uid, state, submitted_ms) VALUES (?1, ?2, 0, 'pending', 1)",
            rusqlite::params![name, spec],
        )
        .unwrap();
    };
    add("fill", 7);
    for i in 0..n {
        add(&format!("p{i}"), 1);
    }
    tx.commit().unwrap();
}

/// What the red team did to the daemon, on a bus configured like the system
/// bus with the shipped policy: thousands of pending workers, then 16
/// clients run by `nobody` (not a member) asking for all of them at once
/// (GetManagedObjects, Introspect of the worker directory and of `/`,
/// ListPending) while a member submits with busctl. zbus answered the first
/// two under the object tree's lock, which the loop needs to add an object:
/// the loop stalled for 92 s, without WATCHDOG=1. The invariants: the
/// watchdog never goes a whole period without a ping; a submit is either
/// answered or leaves nothing behind; memory comes back. The figures
/// (printed, FIGURES) go to docs/reliability.md.
#[test]
fn a_flood_of_big_reads_stalls_neither_the_loop_nor_a_submit() {
    use std::os::unix::net::UnixDatagram;
    use std::time::{Duration, Instant};
    const PENDING: usize = 20_000;
    const WATCHDOG: Duration = Duration::from_secs(4);
    let (member, dir, sim) = member_and_majin();
    seed_pending(&dir.path().join("state"), PENDING);
    let sock_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let bus = Bus::system_like(dir.path(), Some(policy_file()));
    let usec = WATCHDOG.as_micros().to_string();
    let d = Daemon::start(
        &bus,
        dir.path(),
        &sim,
        &[
            ("NOTIFY_SOCKET", sock_path.to_str().unwrap()),
            ("WATCHDOG_USEC", &usec),
        ],
    );
    let pid = d.child.id();
    // Every WATCHDOG=1, timed, from start to the end of the test.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pings = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut at = Vec::new();
            let mut buf = [0u8; 4096];
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(n) = sock.recv(&mut buf) {
                    if String::from_utf8_lossy(&buf[..n]).contains("WATCHDOG=1") {
                        at.push(Instant::now());
                    }
                }
            }
            at
        })
    };
    let a = bus.address.clone();
    eventually("the ledger's workers published", || {
        manager(&a, None, "ListWorkers", &[])
            .stdout
            .starts_with(&format!("a(ssusdaud) {}", PENDING + 1))
    });
    let rss_before = rss_kib(pid);
    // (path, interface, method) of the big reads; each reader a shell loop
    // of busctl as nobody, a line in its file per answer.
    let reads: &[(&str, &str, &str)] = &[
        (
            "/org/astraeus/Node1",
            "org.freedesktop.DBus.ObjectManager",
            "GetManagedObjects",
        ),
        (
            "/org/astraeus/Node1/worker",
            "org.freedesktop.DBus.Introspectable",
            "Introspect",
        ),
        ("/", "org.freedesktop.DBus.Introspectable", "Introspect"),
        (
            "/org/astraeus/Node1",
            "org.astraeus.Node1.Manager",
            "ListPending",
        ),
    ];
    let answered_file = |i: usize| dir.path().join(format!("answered-{i}"));
    let mut readers = Vec::new();
    for i in 0..16 {
        let (path, iface, method) = reads[i % reads.len()];
        let script = format!(
            "while :; do busctl --address={a} call org.astraeus.Node1 {path} {iface} {method} \
             >/dev/null && echo >> {out}; done",
            out = answered_file(i).display()
        );
        std::fs::write(answered_file(i), "").unwrap();
        let _ = std::process::Command::new("chown")
            .args(["nobody", answered_file(i).to_str().unwrap()])
            .status();
        readers.push(
            std::process::Command::new("setpriv")
                .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
                .args(["sh", "-c", &script])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        );
    }
    let flood_start = Instant::now();
    // Let the flood build up before the member comes.
    std::thread::sleep(Duration::from_secs(2));
    let mut submits = Vec::new();
    for i in 0..20 {
        let name = format!("s{i}");
        let t = Instant::now();
        let o = manager_spec_within(
            &a,
            Some(member),
            25,
            "SubmitWorker",
            &shared_spec(&name, "1"),
        );
        submits.push((name, o.ok, o.stderr, t.elapsed()));
        std::thread::sleep(Duration::from_millis(300));
    }
    // The big reads take turns (one is built at a time): the flood goes on
    // until each kind was answered at least once.
    let counted = || -> Vec<usize> {
        (0..16)
            .map(|i| {
                std::fs::read_to_string(answered_file(i))
                    .unwrap()
                    .lines()
                    .count()
            })
            .collect()
    };
    let per_kind = |c: &[usize]| -> Vec<usize> {
        (0..reads.len())
            .map(|k| (k..16).step_by(reads.len()).map(|i| c[i]).sum())
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    while per_kind(&counted()).contains(&0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    for mut r in readers {
        let _ = r.kill();
        let _ = r.wait();
    }
    let flood_for = flood_start.elapsed();
    let counted = per_kind(&counted());
    // Calls queued before the clients left are still answered: wait until the
    // daemon is idle (under 5 % of a CPU for a second). A listing asked
    // sooner waited behind them, past busctl's 25 s when the machine was
    // busy with other tests.
    let cpu_ticks = || cpu_ticks(pid);
    let mut last = cpu_ticks();
    for _ in 0..60 {
        std::thread::sleep(Duration::from_secs(1));
        let now = cpu_ticks();
        if now - last < 5 {
            break;
        }
        last = now;
    }
    // Settled: whatever was answered exists, whatever failed left nothing.
    let listing = manager(&a, None, "ListWorkers", &[]);
    assert!(listing.ok, "ListWorkers: {}", listing.stderr);
    let listed = listing.stdout;
    let mut took: Vec<Duration> = Vec::new();
    for (name, ok, err, t) in &submits {
        let shown = listed.contains(&format!("\"{name}\""));
        match ok {
            true => assert!(shown, "{name} was answered but is not listed"),
            false => assert!(!shown, "{name} failed ({err}) but is live"),
        }
        took.push(*t);
    }
    let answered = submits.iter().filter(|s| s.1).count();
    let rss_after = rss_kib(pid);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let pings = pings.join().unwrap();
    let gaps: Vec<Duration> = pings.windows(2).map(|w| w[1] - w[0]).collect();
    let max_gap = gaps.iter().max().copied().unwrap_or_default();
    took.sort();
    let per_kind: Vec<String> = reads
        .iter()
        .zip(&counted)
        .map(|((path, _, method), n)| format!("{method} {path} ×{n}"))
        .collect();
    eprintln!(
        "FIGURES {PENDING} pending, 16 readers as nobody for {flood_for:?}: {}; member \
         submits {answered}/20 answered, p50 {:?}, max {:?}; WATCHDOG=1 every {:?} (period \
         {WATCHDOG:?}), largest gap {max_gap:?} of {} pings; RSS {} MiB before, {} MiB after",
        per_kind.join(", "),
        took[took.len() / 2],
        took[took.len() - 1],
        WATCHDOG / 2,
        pings.len(),
        rss_before / 1024,
        rss_after / 1024,
    );
    assert!(
        pings.len() >= 3,
        "the watchdog must be fed while the test runs"
    );
    assert!(
        max_gap < WATCHDOG,
        "a watchdog period without WATCHDOG=1 ({max_gap:?}): systemd would have killed the daemon"
    );
    assert!(
        counted.iter().all(|&n| n > 0),
        "every kind of big read is answered too: {counted:?}"
    );
    // It grew by 1.4 to 2.8 GB and kept it when zbus built these answers.
    assert!(
        rss_after < 2 * rss_before,
        "memory after the flood: {rss_after} KiB, before: {rss_before} KiB"
    );
    assert!(
        d.log_text().lines().all(|l| !l.contains("ERROR")),
        "{}",
        d.log_text()
    );
}

/// A submit that waited longer than a D-Bus client waits (20 s, under the
/// usual 25 s timeout) is refused unprocessed: its caller has most likely
/// been told "timed out", and must not find a worker placed behind its back.
/// Held here with a failpoint in the adaptor; the caller waits 40 s.
#[test]
fn a_submit_older_than_its_callers_patience_is_refused_unprocessed() {
    let dir = open_tempdir();
    let sim = dir.path().join("majin.toml");
    std::fs::write(&sim, MAJIN_TOML).unwrap();
    let bus = Bus::session();
    let d = Daemon::start(
        &bus,
        dir.path(),
        &sim,
        &[("ASTRAEUS_FAILPOINTS", "bus.submit=pause21000@1")],
    );
    let a = &bus.address;
    let submit =
        |name: &str| manager_spec_within(a, None, 40, "SubmitWorker", &shared_spec(name, "1"));
    let late = submit("late");
    assert!(
        !late.ok,
        "a submit held 21 s was carried out: {}",
        late.stdout
    );
    assert!(
        late.stderr.contains("nothing was submitted"),
        "{}",
        late.stderr
    );
    assert!(
        !manager(a, None, "ListWorkers", &[]).stdout.contains("late"),
        "nothing of it is live"
    );
    assert!(
        d.log_text().contains("refused unprocessed"),
        "the journal says why: {}",
        d.log_text()
    );
    // Only the held one: the next is carried out.
    assert!(submit("prompt").ok);
    assert!(manager(a, None, "ListWorkers", &[])
        .stdout
        .contains("prompt"));
}

/// A zbus connection to the bus at `address`, run by `rt`.
fn connected(rt: &tokio::runtime::Runtime, address: &str) -> zbus::Connection {
    rt.block_on(async {
        zbus::connection::Builder::address(address)
            .build()
            .await
            .unwrap()
    })
}

/// Run by `a_flood_of_big_messages_is_refused_by_size` as another user (this binary, re-executed
/// under setpriv): keeps 4 WhyNot calls of 30 MiB each in flight until
/// killed. Does nothing in a normal run.
#[test]
fn flooder_of_big_messages() {
    let Ok(address) = std::env::var("ASTRAEUS_TEST_FLOOD_ADDRESS") else {
        return;
    };
    flooder_runtime().block_on(async move {
        let conn = zbus::connection::Builder::address(address.as_str())
            .build()
            .await
            .unwrap();
        let big = std::sync::Arc::new("x".repeat(30 << 20));
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let (conn, big) = (conn.clone(), big.clone());
            tasks.push(tokio::spawn(async move {
                loop {
                    let _ = manager_call(&conn, "WhyNot", &big).await;
                }
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
    });
}

/// Four non-members each keep four 30 MiB WhyNot calls in flight (on a bus
/// with the system bus's limits: 32 MiB a message, 127 MiB queued per
/// connection) while a member makes 30 calls with astraeusctl. The red team
/// saw 6 of 30 raw calls fail with "destination has a full message queue".
/// Each big call is refused in the adaptor by size, before it is parsed or
/// queued for the loop. FIGURES go to docs/reliability.md. Asserted: the
/// oversized calls get InvalidRequest naming the field, the daemon's memory
/// does not keep what they sent, and — in an optimised build, as packaged —
/// none of the member's calls fails (what the bus still refuses astraeusctl
/// sends again: the test above). `.ci/run` runs this test once more with
/// `--release` for that: unoptimised, zbus zero-fills each 30 MiB buffer
/// byte by byte (its reader is instantiated in our crate, so optimising the
/// dependencies does not help) and reads slower than dbus-daemon routes, so
/// the bus's queue to the daemon fills whatever the daemon does after.
#[test]
fn a_flood_of_big_messages_is_refused_by_size() {
    use std::time::{Duration, Instant};
    let (member, dir, sim) = member_and_majin();
    let bus = Bus::system_like(dir.path(), Some(policy_file()));
    let d = Daemon::start(&bus, dir.path(), &sim, &[]);
    let a = bus.address.clone();
    let rss_before = rss_kib(d.child.id());
    // What a big call gets back (here, as root, through busctl's own limits
    // it cannot be sent: zbus from this process).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let conn = connected(&rt, &a);
    let (name, msg) = call(&rt, &conn, "WhyNot", &"x".repeat(30 << 20)).unwrap_err();
    assert_eq!(name, "org.astraeus.Node1.Error.InvalidRequest", "{msg}");
    assert!(
        msg.starts_with("request: 31457280 bytes is too large"),
        "{msg}"
    );
    let mut flooders: Vec<AsUser> = (0..4)
        .map(|_| {
            let quiet = std::process::Stdio::null();
            as_nobody(
                "flooder_of_big_messages",
                "ASTRAEUS_TEST_FLOOD_ADDRESS",
                &a,
                quiet,
            )
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    // Who is busy while the member calls: the daemon or the bus daemon.
    let ticks = cpu_ticks;
    let bus_pid: u32 = String::from_utf8_lossy(
        &std::process::Command::new("pgrep")
            .args(["-f", &format!("config-file={}", dir.path().display())])
            .output()
            .unwrap()
            .stdout,
    )
    .trim()
    .parse()
    .unwrap_or(0);
    let (d0, b0, t0) = (ticks(d.child.id()), ticks(bus_pid), Instant::now());
    let spec = dir.path().join("probe.json");
    std::fs::write(&spec, shared_spec("probe", "1")).unwrap();
    let mut failed = Vec::new();
    let mut sent_again = 0;
    let mut took = Vec::new();
    for _ in 0..30 {
        let t = Instant::now();
        let o = ctl(&a, Some(member), &["why", spec.to_str().unwrap()]);
        took.push(t.elapsed());
        if !o.ok {
            failed.push(o.stderr.trim().to_string());
        } else if o.stderr.contains("the bus refused") {
            sent_again += 1;
        }
    }
    let rss_during = rss_kib(d.child.id());
    let secs = t0.elapsed().as_secs_f64() * 100.0;
    let busy = (
        (ticks(d.child.id()) - d0) as f64 / secs,
        (ticks(bus_pid) - b0) as f64 / secs,
    );
    for f in &mut flooders {
        let _ = f.kill();
        let _ = f.wait();
    }
    std::thread::sleep(Duration::from_secs(2));
    let rss_after = rss_kib(d.child.id());
    took.sort();
    eprintln!(
        "FIGURES big messages: 4 clients × 4 WhyNot of 30 MiB in flight; the member's 30 calls: \
         {} failed {:?}, {} refused by the bus at first and sent again, p50 {:?}, max {:?}; \
         CPU: daemon {:.0} %, dbus-daemon {:.0} %; RSS {} MiB before, {} MiB during, {} MiB after",
        failed.len(),
        failed.first(),
        sent_again,
        took[15],
        took[29],
        busy.0 * 100.0,
        busy.1 * 100.0,
        rss_before / 1024,
        rss_during / 1024,
        rss_after / 1024
    );
    assert!(
        rss_after < rss_before + 128 * 1024,
        "the daemon kept what the flood sent: {rss_before} KiB before, {rss_after} KiB after"
    );
    // Optimised, the daemon reads about as fast as dbus-daemon routes, and
    // the bus's queue to it is seldom full (0 of 30 raw busctl calls refused
    // in most runs, 1 in one fresh-clone CI run); when it is, astraeusctl
    // sends the call again. Unoptimised, the daemon reads slower than the
    // bus routes (zbus zero-fills each 30 MiB buffer) and calls are delayed
    // more: measured, not asserted. docs/reliability.md §3.
    if !cfg!(debug_assertions) {
        assert!(
            failed.is_empty(),
            "{} of a member's 30 calls failed under the flood: {:?}",
            failed.len(),
            failed.first()
        );
    }
}

/// When the bus's queue to the daemon is full, dbus-daemon refuses every
/// call to it before the daemon sees it (`LimitsExceeded`); a raw client
/// gets that error. astraeusctl sends such a call again until the queue has
/// room: a member's command waits out a flood instead of failing. Made
/// certain here by stopping the daemon (SIGSTOP) and queueing 150 MiB at it.
#[test]
fn a_call_the_bus_refuses_for_a_full_queue_is_sent_again_by_astraeusctl() {
    let (member, dir, sim) = member_and_majin();
    let bus = Bus::system_like(dir.path(), Some(policy_file()));
    let d = Daemon::start(&bus, dir.path(), &sim, &[]);
    let a = bus.address.clone();
    let spec = dir.path().join("probe.json");
    std::fs::write(&spec, shared_spec("probe", "1")).unwrap();
    d.signal(libc::SIGSTOP);
    // Five 30 MiB calls the stopped daemon cannot read: more than the
    // bus's 127 MiB queue for one connection.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let conn = connected(&rt, &a);
    let big = std::sync::Arc::new("x".repeat(30 << 20));
    for _ in 0..5 {
        let (conn, big) = (conn.clone(), big.clone());
        rt.spawn(async move { manager_call(&conn, "WhyNot", &big).await.map(drop) });
    }
    let mut refused = String::new();
    eventually("the bus refuses calls to the daemon", || {
        let o = manager_spec_within(&a, Some(member), 1, "WhyNot", &shared_spec("probe", "1"));
        refused = o.stderr;
        refused.contains("full message queue")
    });
    let ctl_call = {
        let (a, spec) = (a.clone(), spec.to_str().unwrap().to_string());
        std::thread::spawn(move || ctl(&a, Some(member), &["why", &spec]))
    };
    // Long enough for astraeusctl to start and meet the full queue.
    std::thread::sleep(std::time::Duration::from_secs(2));
    d.signal(libc::SIGCONT);
    let o = ctl_call.join().unwrap();
    assert!(o.ok, "astraeusctl gave up: {}", o.stderr);
    assert!(
        o.stdout.starts_with("it would start now on GPU"),
        "{}",
        o.stdout
    );
    assert!(
        o.stderr
            .contains("the bus refused WhyNot: its queue to the daemon is full"),
        "astraeusctl never met the full queue (a raw client was refused: {refused}): {}",
        o.stderr
    );
    rt.shutdown_background();
}

/// A submit is answered within 5 s while the daemon is held at `failpoint`.
fn answered_meanwhile(address: &str, failpoint: &str) {
    let submit = manager_spec_within(
        address,
        None,
        5,
        "SubmitWorker",
        &shared_spec("meanwhile", "1"),
    );
    assert!(
        submit.ok,
        "a submit waited on what {failpoint} holds: {}",
        submit.stderr
    );
}

/// Ok when a busctl call succeeded with a reply starting `with`; else
/// what it printed.
fn replied(o: &Out, with: &str) -> Result<(), String> {
    match o.ok && o.stdout.starts_with(with) {
        true => Ok(()),
        false => Err(format!("{} {}", o.stdout, o.stderr)),
    }
}

/// A daemon held for 6 s at `failpoint` by `ask` (on a thread, given the
/// bus address): a submit is answered meanwhile (within 5 s), before `ask`
/// gets its answer — so whatever `ask` made the daemon do, it did it off the
/// loop. Under the page's 10 s for a whole connection: held 10 s, the
/// page's answer came just too late on a loaded CI machine.
fn held_at_holds_no_one_else(
    failpoint: &str,
    config: &str,
    ask: impl FnOnce(String) -> Result<(), String> + Send + 'static,
) {
    let dir = open_tempdir();
    let bus = Bus::session();
    let d = start_majin(
        &bus,
        dir.path(),
        config,
        &[("ASTRAEUS_FAILPOINTS", &format!("{failpoint}=pause6000"))],
    );
    let a = bus.address.clone();
    let asked = std::thread::spawn(move || ask(a));
    eventually("the request is held inside", || {
        d.log_text()
            .contains(&format!("failpoint {failpoint} reached"))
    });
    answered_meanwhile(&bus.address, failpoint);
    assert!(
        !asked.is_finished(),
        "answered before the failpoint let it go"
    );
    asked.join().unwrap().unwrap();
}

/// The inventory's re-read (NVML, /proc, the user-name lookup of another
/// user's process: NSS, perhaps LDAP) runs off the loop's thread: held
/// there 10 s, it holds no call, and its machine is applied when it ends.
#[test]
fn a_slow_inventory_read_holds_no_one_else() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let d = start_majin(
        &bus,
        dir.path(),
        "",
        &[("ASTRAEUS_FAILPOINTS", "inventory.read=pause10000")],
    );
    let outside = |a: &str| {
        busctl(
            a,
            &[
                "get-property",
                "org.astraeus.Node1",
                "/org/astraeus/Node1/gpu/0",
                "org.astraeus.Node1.Gpu",
                "HeldOutsideGb",
            ],
        )
        .stdout
    };
    assert_eq!(outside(&bus.address).trim(), "d 1");
    // The desktop now holds 2 GB: the next refresh re-reads, and is held.
    let sim = dir.path().join("majin.toml");
    let text = std::fs::read_to_string(&sim).unwrap();
    std::fs::write(&sim, text.replace("outside_gb = 1", "outside_gb = 2")).unwrap();
    eventually("the re-read is held inside", || {
        d.log_text().contains("failpoint inventory.read reached")
    });
    answered_meanwhile(&bus.address, "inventory.read");
    assert_eq!(
        outside(&bus.address).trim(),
        "d 1",
        "applied before it ended"
    );
    eventually("the re-read machine applied", || {
        outside(&bus.address).trim() == "d 2"
    });
}

/// The refresh's check that holders still run (two reads of /proc each, and
/// a member may name thousands across its workers) runs off the loop's
/// thread: held there 10 s, it holds no call, and a holder found gone is
/// dropped when it ends.
#[test]
fn a_slow_holder_check_holds_no_one_else() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let d = start_majin(
        &bus,
        dir.path(),
        "[inventory]\nrefresh_seconds = 0.2\n",
        &[("ASTRAEUS_FAILPOINTS", "holders.check=pause10000")],
    );
    let mut sleeper = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let pid = sleeper.id();
    let spec = format!(
        r#"{{"name":"held","holders":[{pid}],"requested_resources":{{"gpu_requests":{{"shared":true,"memory_gb":1}}}}}}"#
    );
    let o = manager(&bus.address, None, "SubmitWorker", &["s", &spec]);
    assert!(o.ok, "{}", o.stderr);
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    eventually("the check is held inside", || {
        d.log_text().contains("failpoint holders.check reached")
    });
    answered_meanwhile(&bus.address, "holders.check");
    let gone = format!("holder pid {pid} of worker held is gone");
    assert!(
        !d.log_text().contains(&gone),
        "dropped before the check ended"
    );
    eventually("the gone holder dropped when the check ends", || {
        d.log_text().contains(&gone)
    });
}

/// A usage report reads the ledger on its own connection, away from the
/// service loop: a caller asking for a year of rows (seconds of work) holds
/// no one else.
#[test]
fn a_long_usage_report_holds_no_one_else() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    held_at_holds_no_one_else("usage.report", "", move |a| {
        let (from, to) = ((now - 3600).to_string(), now.to_string());
        let o = manager(&a, None, "UsageReport", &["xxs", &from, &to, "worker"]);
        replied(&o, "a(sssttx)")
    });
}

/// A malformed report is refused before its caller takes a turn: with a
/// report held in the ledger's one turn, a report asked for with a bad
/// group_by or window is answered at once, the held one still running
/// (before, it waited for the held report to end, then the loop refused it).
#[test]
fn a_malformed_report_waits_for_no_turn() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let dir = open_tempdir();
    let bus = Bus::session();
    let d = start_majin(
        &bus,
        dir.path(),
        "",
        &[("ASTRAEUS_FAILPOINTS", "usage.report=pause8000")],
    );
    let (from, to) = ((now - 3600).to_string(), now.to_string());
    let held = {
        let (a, from, to) = (bus.address.clone(), from.clone(), to.clone());
        std::thread::spawn(move || manager(&a, None, "UsageReport", &["xxs", &from, &to, "worker"]))
    };
    eventually("the report is held inside", || {
        d.log_text().contains("failpoint usage.report reached")
    });
    let long = (401 * 86_400).to_string();
    let cases: [(&str, [&str; 4], &str); 5] = [
        ("UsageReport", ["xxs", &from, &to, "colour"], "group_by"),
        (
            "UsageReport",
            ["xxs", &to, &from, "worker"],
            "to: must be after from",
        ),
        (
            "UsageReport",
            ["xxs", "0", &long, "worker"],
            "to: a window of at most 400 days",
        ),
        (
            "UsageReport",
            ["xxs", &to, "999999999999", "worker"],
            "to: epoch seconds",
        ),
        (
            "SliceReport",
            ["sxx", "", &to, &from],
            "to: must be after from",
        ),
    ];
    for (method, args, said) in cases {
        let o = manager(&bus.address, None, method, &args);
        assert!(
            !o.ok && o.stderr.contains(said),
            "{method} {args:?}: {}",
            o.stderr
        );
    }
    assert!(
        !held.is_finished(),
        "the malformed reports were answered only after the held one"
    );
    let o = held.join().unwrap();
    assert!(o.ok, "{}", o.stderr);
}

/// So does a slice report: read by their end, the slices of a window long
/// ago are every slice since, which a caller names (any window of 400 days).
#[test]
fn a_long_slice_report_holds_no_one_else() {
    held_at_holds_no_one_else("slice.report", "", |a| {
        let o = manager(&a, None, "SliceReport", &["sxx", "", "0", "86400"]);
        replied(&o, "a(ssxxxxdddddds) 0")
    });
}

/// And the listing of ended workers (up to 10,000 rows of the ledger, which
/// anyone may ask for, again and again).
#[test]
fn a_long_listing_of_ended_workers_holds_no_one_else() {
    held_at_holds_no_one_else("ended.list", "", |a| {
        let o = manager(&a, None, "ListEnded", &["xu", "0", "10000"]);
        replied(&o, "a(susaudxxxis) 0")
    });
}

/// GetManagedObjects and ListWorkers are built and serialised on the
/// lists runtime, not on the thread the loop and the bus share: held there
/// (as 100,000 workers would hold them, seconds and tens of MB), they hold
/// no one else.
#[test]
fn a_long_object_listing_holds_no_one_else() {
    held_at_holds_no_one_else("bus.listing", "", |a| {
        let o = busctl(
            &a,
            &[
                "call",
                "org.astraeus.Node1",
                "/org/astraeus/Node1",
                "org.freedesktop.DBus.ObjectManager",
                "GetManagedObjects",
            ],
        );
        replied(&o, "a{oa{sa{sv}}}")
    });
}

#[test]
fn a_long_worker_list_holds_no_one_else() {
    held_at_holds_no_one_else("bus.listing", "", |a| {
        let o = manager(&a, None, "ListWorkers", &[]);
        replied(&o, "a(")
    });
}

/// The machine page gathers its workers from the objects' views, off the
/// loop (100,000 workers take seconds): anyone who can reach the page holds
/// no one else.
#[test]
fn a_page_of_many_workers_holds_no_one_else() {
    let port = free_port();
    let config = format!("[http]\nlisten = \"127.0.0.1:{port}\"\n");
    held_at_holds_no_one_else("page.workers", &config, move |_| {
        match get(port, "/machines/majin/workers") {
            (200, _, body) if body.contains("\"workers\"") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
}

/// Reading a worker's Request asks the bus daemon who reads it (the env is
/// the owner's and root's), and zbus holds its object tree for the whole
/// Get: a new object waits behind it, and a submit's reply waits for its
/// object. A lookup the bus daemon is slow to answer (a flood delays it) is
/// given up after half a second with the env hidden, rather than hold every
/// submit (or, were zbus's dispatch queue to fill meanwhile, deadlock).
#[test]
fn a_slow_reader_lookup_holds_no_submit() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let d = start_majin(
        &bus,
        dir.path(),
        "",
        &[("ASTRAEUS_FAILPOINTS", "bus.request_reader=pause30000")],
    );
    let a = bus.address.clone();
    let o = manager(&a, None, "SubmitWorker", &["s", &shared_spec("big", "7")]);
    assert!(o.ok, "{}", o.stderr);
    // Waits (GPU 0's 7 GB are taken), its object stays.
    let secret = r#"{"name":"secret","requested_resources":{"gpu_requests":{"count":1,"shared":true,"memory_gb":4}},"run":{"container":{"image":"localhost/none","command":["true"],"env":{"TOKEN":"s3cret"}}}}"#;
    let o = manager(&a, None, "SubmitWorker", &["s", secret]);
    assert!(o.stdout.contains("pending"), "{} {}", o.stdout, o.stderr);

    let started = std::time::Instant::now();
    let address = a.clone();
    let reader = std::thread::spawn(move || {
        busctl(
            &address,
            &[
                "--timeout=60",
                "get-property",
                "org.astraeus.Node1",
                "/org/astraeus/Node1/worker/secret",
                "org.astraeus.Node1.Worker",
                "Request",
            ],
        )
    });
    eventually("the Get's lookup is held", || {
        d.log_text()
            .contains("failpoint bus.request_reader reached")
    });
    let o = manager_spec_within(&a, None, 10, "SubmitWorker", &shared_spec("small", "1"));
    assert!(o.ok, "a submit waited behind a Get: {}", o.stderr);
    let got = reader.join().unwrap();
    assert!(got.ok, "{}", got.stderr);
    assert!(
        got.stdout.contains(r#"\"TOKEN\":\"(hidden)\""#) && !got.stdout.contains("s3cret"),
        "an unlearnt reader sees no env: {}",
        got.stdout
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "the Get waited out the lookup"
    );
}

/// The system bus takes a message of at most 32 MiB (dbus-daemon's default
/// `max_message_size`), and a bigger one is not refused: the bus daemon
/// drops the connection that sent it. Requests of 120 KB each (padding is
/// kept: the request is shown as written) make the listing of every object
/// bigger than that: the call is refused, saying what to ask for, and the
/// daemon stays on the bus.
#[test]
fn a_listing_bigger_than_the_bus_carries_is_refused_not_sent() {
    let dir = open_tempdir();
    let bus = Bus::system_like(dir.path(), Some(policy_file()));
    let d = start_majin(&bus, dir.path(), "", &[]);
    let a = &bus.address;
    // 120 KB each: one argument of busctl's may not be longer than 128 KiB.
    let pad = " ".repeat(120_000);
    for i in 0..290 {
        let spec = format!(
            r#"{{"name":"w{i}",{pad}"requested_resources":{{"gpu_requests":{{"shared":true,"memory_gb":0.01}}}}}}"#
        );
        let o = manager(a, None, "SubmitWorker", &["s", &spec]);
        assert!(o.ok, "{}", o.stderr);
    }
    let o = busctl(
        a,
        &[
            "call",
            "org.astraeus.Node1",
            "/org/astraeus/Node1",
            "org.freedesktop.DBus.ObjectManager",
            "GetManagedObjects",
        ],
    );
    assert!(!o.ok, "{}", &o.stdout[..o.stdout.len().min(200)]);
    assert!(
        o.stderr
            .contains("more than the bus carries in one message"),
        "{}",
        o.stderr
    );
    // Still on the bus, answering.
    let o = manager(a, None, "ListWorkers", &[]);
    assert!(
        o.ok && o.stdout.contains("\"w289\""),
        "{}\n{}",
        o.stderr,
        d.log_text()
    );
}
