//! Kubernetes claims through the daemon's D-Bus API (#64, the daemon's
//! side of the DRA driver): what each GPU offers the cluster, a claim's
//! device booked in the ledger where it fits now or refused with the
//! daemon's own reason, idempotent prepares and unprepares, and claims
//! kept across a kill -9. The real daemon on a real dbus-daemon, with
//! busctl as the kubelet plugin would call it.

mod common;
use common::*;

const UUID: &str = "GPU-5c0a7d3e-4060-4b1e-9f00-000000000000";
const UID1: &str = "11111111-2222-3333-4444-555555555555";
const UID2: &str = "66666666-7777-8888-9999-aaaaaaaaaaaa";
const STEP: u64 = 1 << 28;

fn prepare(a: &str, uid: &str, name: &str, bytes: u64) -> Out {
    manager(
        a,
        None,
        "PrepareClaim",
        &["sssst", uid, "team-a", name, UUID, &bytes.to_string()],
    )
}

/// The GPU's offer to the cluster, in bytes, as busctl prints the list.
fn offered(a: &str) -> u64 {
    let o = manager(a, None, "ListClusterOffers", &[]);
    assert!(o.ok, "{}", o.stderr);
    // a(usstbbbss) 1 0 "GPU-…" "NVIDIA GeForce RTX 4060" 7516192768 true true false "" ""
    let fields: Vec<&str> = o.stdout.split_whitespace().collect();
    assert_eq!(fields[3], format!("\"{UUID}\""), "{}", o.stdout);
    assert_eq!(fields[fields.len() - 3], "false", "not a MIG instance");
    assert_eq!(
        fields[fields.len() - 1],
        "\"\"",
        "no driver in the simulated machine"
    );
    fields[fields.len() - 6].parse().unwrap()
}

/// Whether the GPU may be taken whole by a claim now.
fn whole(a: &str) -> bool {
    let o = manager(a, None, "ListClusterOffers", &[]);
    let fields: Vec<&str> = o.stdout.split_whitespace().collect();
    fields[fields.len() - 4] == "true"
}

/// Why the GPU offers the cluster nothing it otherwise would (the plugin's
/// device taint): "" when nothing is withheld.
fn withheld(a: &str) -> String {
    let o = manager(a, None, "ListClusterOffers", &[]);
    let fields: Vec<&str> = o.stdout.split_whitespace().collect();
    fields[fields.len() - 2].to_string()
}

/// The offer says why a GPU is withheld: held whole by a local worker,
/// unhealthy; a claim holding it whole is no reason (the scheduler counts
/// its own).
#[test]
fn the_offer_says_why_a_gpu_is_withheld() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let d = start_majin(&bus, dir.path(), "", &[]);
    let a = &bus.address;
    assert_eq!(withheld(a), "\"\"");
    let whole = r#"{"name":"train","requested_resources":{"gpu_requests":{"count":1}}}"#;
    assert!(manager(a, None, "SubmitWorker", &["s", whole]).ok);
    assert_eq!(withheld(a), "\"held-by-host\"");
    assert_eq!(offered(a), 0);
    assert!(manager(a, None, "StopWorker", &["s", "train"]).ok);
    assert!(prepare(a, UID1, "train", 0).ok);
    assert_eq!(
        withheld(a),
        "\"\"",
        "a claim's hold is the scheduler's to count"
    );
    assert!(manager(a, None, "UnprepareClaim", &["s", UID1]).ok);
    std::fs::write(
        dir.path().join("majin.toml"),
        MAJIN_TOML.replace("outside_gb = 1", "outside_gb = 1\nhealthy = false"),
    )
    .unwrap();
    d.signal(libc::SIGHUP);
    eventually("withheld as unhealthy", || withheld(a) == "\"unhealthy\"");
}

#[test]
fn claims_are_booked_where_they_fit_now_and_the_cluster_is_offered_what_local_work_leaves() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let port = free_port();
    let page = format!("[http]\nlisten = \"127.0.0.1:{port}\"\n");
    let mut d = start_majin(&bus, dir.path(), &page, &[]);
    let a = &bus.address;
    // 8 GB, 1 held outside: 7 offered, 28 steps of 256 MiB.
    assert_eq!(offered(a), 28 * STEP);
    assert!(whole(a), "free: a claim may take it whole");
    assert!(
        manager(
            a,
            None,
            "SubmitWorker",
            &["s", &shared_spec("local", "2.5")]
        )
        .ok
    );
    // Local work shrinks the offer: 4.5 GB left, 18 steps; not whole now.
    assert_eq!(offered(a), 18 * STEP);
    assert!(!whole(a), "a local worker shares it");

    let o = prepare(a, UID1, "voice", 16 * STEP);
    assert!(o.ok, "{}", o.stderr);
    assert_eq!(
        o.stdout,
        format!(
            "os \"/org/astraeus/Node1/worker/claim_2d{}\" \"4\"\n",
            &UID1.replace('-', "_2d")
        ),
        "the worker and its ASTRAEUS_GPU_MEMORY_GB"
    );
    // Where it came from, as a person reads it.
    let shown = ctl(a, None, &["status", &format!("claim-{UID1}")]);
    assert!(
        shown.stdout.contains(&format!(
            "  from:     Kubernetes claim team-a/voice\n  claim:    UID {UID1}\n"
        )),
        "{}",
        shown.stdout
    );
    // The kubelet retries: the same answer, nothing booked twice.
    let again = prepare(a, UID1, "voice", 16 * STEP);
    assert_eq!(again.stdout, o.stdout, "{}", again.stderr);
    let other = prepare(a, UID1, "voice", 8 * STEP);
    assert!(
        !other.ok && other.stderr.contains("is prepared already"),
        "{}",
        other.stderr
    );
    // Claims are the scheduler's to count: the offer is still 4.5 GB.
    assert_eq!(offered(a), 18 * STEP);

    // A local worker won the race: 6.5 of 7 taken. The prepare fails with
    // the daemon's own reason, in the seed's words, and nothing is kept.
    let o = prepare(a, UID2, "listen", 4 * STEP);
    assert!(!o.ok);
    assert!(
        o.stderr
            .contains("GPU 0 of majin: 6.5 of 7 GB taken by shared work; it needs 1"),
        "{}",
        o.stderr
    );
    assert!(gone(a, &format!("claim-{UID2}")));

    // Not in a request: only the plugin's call books a claim.
    let forged =
        format!(r#"{{"name":"forged","claim":{{"namespace":"x","name":"y","uid":"{UID2}"}}}}"#);
    let o = manager(a, None, "SubmitWorker", &["s", &forged]);
    assert!(
        o.stderr.contains("claim: set by PrepareClaim only"),
        "{}",
        o.stderr
    );
    // Field by field.
    let o = prepare(a, UID2, "listen", STEP + 1);
    assert!(
        o.stderr
            .contains("memory_bytes: 268435457 is not a multiple"),
        "{}",
        o.stderr
    );

    // Kept across a kill -9.
    d.child.kill().unwrap();
    d.child.wait().unwrap();
    let d = Daemon::start(&bus, dir.path(), &dir.path().join("majin.toml"), &[]);
    assert_eq!(
        state(a, &format!("claim_2d{}", UID1.replace('-', "_2d"))),
        "s \"running\"\n"
    );
    let again = prepare(a, UID1, "voice", 16 * STEP);
    assert!(again.ok, "{}", again.stderr);

    // Unprepared: its memory frees, and the claim that lost now fits.
    assert!(manager(a, None, "UnprepareClaim", &["s", UID1]).ok);
    assert!(gone(a, &format!("claim-{UID1}")));
    assert!(
        manager(a, None, "UnprepareClaim", &["s", UID1]).ok,
        "again: no error"
    );
    let o = prepare(a, UID2, "listen", 4 * STEP);
    assert!(o.ok, "{}", o.stderr);
    // Whose it is, as a person reads it: its namespace (root, the plugin,
    // booked it), in the table and the JSON.
    let o = ctl(a, None, &["workers"]);
    let row = o
        .stdout
        .lines()
        .find(|l| l.starts_with(&format!("claim-{UID2} ")))
        .unwrap_or_default();
    assert!(row.contains(" k8s/team-a "), "{}", o.stdout);
    let o = ctl(a, None, &["--json", "workers"]);
    let j: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    let w = j
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == format!("claim-{UID2}"))
        .unwrap_or_else(|| panic!("{}", o.stdout));
    assert_eq!(w["owner_name"], "k8s/team-a");
    assert_eq!(w["kubernetes_claim"]["name"], "listen");
    // And on the page (its JSON, as the page reads it).
    let (code, _, body) = get(port, "/machines/majin/workers");
    assert_eq!(code, 200, "{body}");
    let page: serde_json::Value = serde_json::from_str(&body).unwrap();
    let on_page = page["workers"]
        .as_array()
        .unwrap_or_else(|| panic!("{body}"))
        .iter()
        .find(|w| w["name"] == format!("claim-{UID2}"))
        .unwrap_or_else(|| panic!("{body}"));
    assert_eq!(on_page["owner"], "k8s/team-a", "{body}");
    // The local worker stays its owner's (root here, by name).
    let local = j
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == "local")
        .unwrap();
    assert_eq!(local["owner_name"], "root");
    // (Billed by namespace too: store/usage.rs's a_claim_is_billed_to_its_namespace.)
    assert!(
        d.log_text().contains("claim team-a/listen prepared on"),
        "{}",
        d.log_text()
    );
}

/// Only root (the kubelet plugin) prepares claims: a member is refused by
/// the daemon itself, whatever the bus lets through.
#[test]
fn a_member_cannot_prepare_or_unprepare_a_claim() {
    assert!(is_root(), "run the suite as root (as CI does)");
    let member = "astraeus-test-a";
    ensure_user(member);
    let dir = open_tempdir();
    let bus = Bus::system_like(dir.path(), Some(&careless_policy(dir.path())));
    std::fs::write(dir.path().join("majin.toml"), MAJIN_TOML).unwrap();
    let _d = Daemon::start(&bus, dir.path(), &dir.path().join("majin.toml"), &[]);
    let a = &bus.address;
    let o = manager(
        a,
        Some(member),
        "PrepareClaim",
        &["sssst", UID1, "team-a", "voice", UUID, &STEP.to_string()],
    );
    assert!(
        o.stderr
            .contains("claims are prepared by the kubelet plugin"),
        "{}",
        o.stderr
    );
    let o = manager(a, Some(member), "UnprepareClaim", &["s", UID1]);
    assert!(
        o.stderr
            .contains("claims are prepared by the kubelet plugin"),
        "{}",
        o.stderr
    );
}

/// A claim is new work: below the ledger's floor of free space it is
/// refused as a submit is (the room kept there is for stops), naming
/// history.min_free_mb; an unprepare still goes through.
#[test]
fn a_claim_is_refused_below_the_floor_of_free_space() {
    let dir = open_tempdir();
    let bus = Bus::session();
    // A floor of 1 TB: more than this disk has free.
    let _d = start_majin(&bus, dir.path(), "[history]\nmin_free_mb = 1048576\n", &[]);
    let a = &bus.address;
    let o = manager(a, None, "SubmitWorker", &["s", &shared_spec("local", "1")]);
    assert!(o.stderr.contains("history.min_free_mb"), "{}", o.stderr);
    let o = prepare(a, UID1, "voice", 4 * STEP);
    assert!(!o.ok, "{}", o.stdout);
    assert!(o.stderr.contains("history.min_free_mb"), "{}", o.stderr);
    assert!(gone(a, &format!("claim-{UID1}")));
    assert!(manager(a, None, "UnprepareClaim", &["s", UID1]).ok);
}
