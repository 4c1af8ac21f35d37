//! Arbitrary argument values for every method of the daemon's D-Bus API
//! (read from the committed introspection XML), on a private bus, seeded.
//! No call may crash or hang the daemon, and every refusal is a typed error:
//! one of org.astraeus.Node1.Error.*, or the bus library's InvalidArgs for
//! values of the wrong type (UnknownObject once worker `w` is gone). BUS_FUZZ_SEED replays a run; BUS_FUZZ_CALLS sets
//! how many calls (CI: 3,000; the long run in docs/reliability.md: more).

mod common;
#[path = "common/ledger_check.rs"]
mod ledger_check;

use common::*;
use ledger_check::{count_from_env, seed_from_env, Rng};
use zbus::{DBusError, Structure, Variant};

/// Strings that have broken parsers before, and fragments of real requests.
fn string(rng: &mut Rng) -> String {
    const POOL: &[&str] = &[
        "",
        "w",
        "majin",
        "owner",
        "{}",
        "[]",
        "null",
        "{\"name\":\"w\"}",
        "{\"name\":\"w\",\"requested_resources\":{\"gpu_requests\":{\"shared\":true,\"memory_gb\":2}}}",
        "{\"name\":\"w\",\"requested_resources\":{\"gpu_requests\":{\"count\":4294967296}}}",
        "{\"name\":\"w\",\"requested_resources\":{\"gpu_requests\":{\"memory_gb\":1e308,\"shared\":true}}}",
        "{\"name\":\"w\",\"run\":{\"vm\":{\"domain_xml\":\"<domain><os/></domain>\"}}}",
        "[{\"action\":\"resume\",\"time\":\"+60\",\"repeat\":0,\"days\":\"0,6\",\"end_type\":1,\"end_value\":3}]",
        "[{\"action\":\"poweroff\",\"time\":-9223372036854775808,\"repeat\":3,\"days\":\"168\"}]",
        "[{\"action\":\"resume\",\"time\":1767250800,\"repeat\":2,\"days\":\"365\",\"end_type\":2,\"end_value\":99999999999}]",
        "\u{1}\u{7f}",
        "é/../../etc",
        "\"\\ud800\"",
        "{\"name\":\"a\",\"name\":\"b\"}",
    ];
    let mut s = POOL[rng.below(POOL.len() as u64) as usize].to_string();
    // Mutate: cut, repeat, or splice random bytes (kept valid UTF-8).
    match rng.below(5) {
        0 => {
            let cut = rng.below(s.len() as u64 + 1) as usize;
            while !s.is_char_boundary(cut.min(s.len())) {
                s.pop();
            }
            s.truncate(cut.min(s.len()));
        }
        1 => s = s.repeat(1 + rng.below(2000) as usize),
        2 => {
            let at = s
                .char_indices()
                .map(|(i, _)| i)
                .nth(rng.below(s.len() as u64 + 1) as usize);
            let c = char::from_u32(rng.below(0x11_0000) as u32).unwrap_or('\u{fffd}');
            s.insert(at.unwrap_or(s.len()), c);
        }
        _ => {}
    }
    // D-Bus strings cannot carry NUL: the bus would drop the sender, not us.
    s.replace('\0', "\u{fffd}")
}

fn value(rng: &mut Rng, ty: &str) -> Variant<'static> {
    match ty {
        "s" => Variant::from(string(rng)),
        "u" => Variant::from(match rng.below(3) {
            0 => 0u32,
            1 => u32::MAX,
            _ => rng.below(8) as u32,
        }),
        "x" => Variant::from(match rng.below(4) {
            0 => i64::MIN,
            1 => i64::MAX,
            2 => 1_767_250_800 + rng.below(1 << 30) as i64,
            _ => rng.next() as i64,
        }),
        "t" => Variant::from(match rng.below(4) {
            0 => 0u64,
            1 => u64::MAX,
            2 => (1 + rng.below(64)) << 28,
            _ => rng.next(),
        }),
        "b" => Variant::from(rng.below(2) == 0),
        other => panic!("add a generator for D-Bus type {other}"),
    }
}

#[test]
fn arbitrary_arguments_to_every_method_get_typed_errors_and_never_break_the_daemon() {
    let (seed, calls) = (
        seed_from_env("BUS_FUZZ_SEED"),
        count_from_env("BUS_FUZZ_CALLS", 3000),
    );
    eprintln!("bus fuzz seed {seed} ({calls} calls); replay with BUS_FUZZ_SEED={seed}");
    let mut rng = Rng(seed | 1);
    let dir = open_tempdir();
    std::fs::write(dir.path().join("majin.toml"), MAJIN_TOML).unwrap();
    let bus = Bus::session();
    let mut d = Daemon::start(&bus, dir.path(), &dir.path().join("majin.toml"), &[]);
    let methods = methods_in_xml();
    let (rt, conn) = blocking_client(&bus.address);
    let mut kinds = std::collections::BTreeMap::<String, u64>::new();
    for i in 0..calls {
        let (iface, method, ins) = &methods[rng.below(methods.len() as u64) as usize];
        let path = match iface.as_str() {
            "org.astraeus.Node1.Manager" => "/org/astraeus/Node1".to_string(),
            "org.astraeus.Node1.Worker" => "/org/astraeus/Node1/worker/w".to_string(),
            _ => continue,
        };
        // Mostly the right types; sometimes a wrong one, to meet the bus's check.
        let types: Vec<&str> = ins
            .iter()
            .map(|t| match rng.below(20) {
                0 => ["s", "u", "x", "b"][rng.below(4) as usize],
                _ => t.as_str(),
            })
            .collect();
        let result = rt.block_on(async {
            let call = async {
                if types.is_empty() {
                    conn.call_method(
                        Some("org.astraeus.Node1"),
                        path.as_str(),
                        Some(iface.as_str()),
                        method.as_str(),
                        &(),
                    )
                    .await
                } else {
                    let mut b = Structure::builder();
                    for t in &types {
                        b = b.append_field(value(&mut rng, t));
                    }
                    let body = b.build().unwrap();
                    conn.call_method(
                        Some("org.astraeus.Node1"),
                        path.as_str(),
                        Some(iface.as_str()),
                        method.as_str(),
                        &body,
                    )
                    .await
                }
            };
            tokio::time::timeout(std::time::Duration::from_secs(10), call).await
        });
        let outcome = match result {
            Err(_) => panic!("call {i} ({method}) hung (seed {seed})"),
            Ok(Ok(_)) => "ok".to_string(),
            Ok(Err(zbus::Error::MethodError(name, msg, _))) => {
                let name = name.to_string();
                let typed = name.starts_with("org.astraeus.Node1.Error.")
                    || name == "org.freedesktop.DBus.Error.InvalidArgs";
                assert!(
                    typed,
                    "call {i} ({method}) failed untyped: {name}: {msg:?} (seed {seed})"
                );
                assert!(
                    !msg.unwrap_or_default().is_empty(),
                    "{name} without a message"
                );
                name
            }
            // The standard errors arrive decoded.
            Ok(Err(zbus::Error::FDO(e))) => {
                let name = e.as_ref().name().to_string();
                let standard = [
                    "org.freedesktop.DBus.Error.InvalidArgs",
                    // Worker w stopped (or never there): its object is gone.
                    "org.freedesktop.DBus.Error.UnknownObject",
                ];
                assert!(
                    standard.contains(&name.as_str()),
                    "call {i} ({method}): {e} (seed {seed})"
                );
                name
            }
            Ok(Err(e)) => panic!("call {i} ({method}): {e} (seed {seed})"),
        };
        *kinds.entry(format!("{method} {outcome}")).or_default() += 1;
        assert!(
            d.child.try_wait().unwrap().is_none(),
            "the daemon died at call {i} (seed {seed})"
        );
    }
    eprintln!("bus fuzz outcomes: {kinds:#?}");
    // Still serving, and still consistent.
    assert!(manager(&bus.address, None, "ListWorkers", &[]).ok);
    let status = d.child.try_wait().unwrap();
    assert!(status.is_none());
    d.signal(libc::SIGTERM);
    let _ = d.child.wait();
}
