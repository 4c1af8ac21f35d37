//! Test support: a private dbus-daemon, the real daemon binary, and the real
//! clients (busctl, gdbus, astraeusctl) run as any user.
#![allow(dead_code)] // each test binary uses a different part

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const MAJIN_TOML: &str = r#"
machine = "majin"
cpu_cores = 16
memory_gb = 64
[[gpu]]
model = "NVIDIA GeForce RTX 4060"
uuid = "GPU-5c0a7d3e-4060-4b1e-9f00-000000000000"
total_gb = 8
outside_gb = 1
"#;

const SESSION_CONF: &str = r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <keep_umask/>
  <listen>unix:tmpdir=/tmp</listen>
  <auth>EXTERNAL</auth>
  <!-- services -->
  <policy context="default">
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
  <limit name="max_incoming_bytes">1000000000</limit>
  <limit name="max_incoming_unix_fds">250000000</limit>
  <limit name="max_outgoing_bytes">1000000000</limit>
  <limit name="max_outgoing_unix_fds">250000000</limit>
  <limit name="max_message_size">1000000000</limit>
  <limit name="service_start_timeout">120000</limit>
  <limit name="auth_timeout">240000</limit>
  <limit name="pending_fd_timeout">150000</limit>
  <limit name="max_completed_connections">100000</limit>
  <limit name="max_incomplete_connections">10000</limit>
  <limit name="max_connections_per_user">100000</limit>
  <limit name="max_names_per_connection">50000</limit>
  <limit name="max_match_rules_per_connection">50000</limit>
  <limit name="max_replies_per_connection">50000</limit>
</busconfig>
"#;

pub struct Bus {
    pub address: String,
    pid: u32,
}

impl Bus {
    /// A private session-type bus: the system's session.conf without its
    /// service directories and includes, so that nothing installed on the
    /// machine (an astraeusd package's activation file) can be started on it.
    pub fn session() -> Bus {
        Bus::session_activating(None)
    }

    /// [`Bus::session`], starting on demand what the D-Bus service files in
    /// `services` name, if given.
    pub fn session_activating(services: Option<&Path>) -> Bus {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("session.conf");
        let servicedir = services
            .map(|d| format!("<servicedir>{}</servicedir>", d.display()))
            .unwrap_or_default();
        std::fs::write(
            &path,
            SESSION_CONF.replace("<!-- services -->", &servicedir),
        )
        .unwrap();
        // dbus-daemon has read its configuration once it printed its address.
        Bus::start(&[&format!("--config-file={}", path.display())])
    }

    /// A bus configured like the system bus (default-deny for method calls),
    /// listening at `dir/bus`, with `policy` (a busconfig file) included when given.
    pub fn system_like(dir: &Path, policy: Option<&Path>) -> Bus {
        let include = policy
            .map(|p| format!("<include>{}</include>", p.display()))
            .unwrap_or_default();
        let conf = format!(
            r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={dir}/bus</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <deny own="*"/>
    <deny send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_requested_reply="true" send_type="method_return"/>
    <allow send_requested_reply="true" send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
    <allow receive_type="signal"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Introspectable"/>
  </policy>
  {include}
</busconfig>
"#,
            dir = dir.display()
        );
        let path = dir.join("system-like.conf");
        std::fs::write(&path, conf).unwrap();
        // Let other users reach the socket's directory.
        let _ = Command::new("chmod").arg("755").arg(dir).status();
        Bus::start(&[&format!("--config-file={}", path.display())])
    }

    fn start(args: &[&str]) -> Bus {
        let out = Command::new("dbus-daemon")
            .args(args)
            .args(["--print-address=1", "--print-pid=1", "--fork"])
            .output()
            .expect("dbus-daemon runs");
        assert!(
            out.status.success(),
            "dbus-daemon: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        let mut lines = text.lines();
        let address = lines.next().unwrap().to_string();
        let pid = lines.next().unwrap().trim().parse().unwrap();
        Bus { address, pid }
    }
}

impl Drop for Bus {
    fn drop(&mut self) {
        unsafe {
            libc::kill(self.pid as i32, libc::SIGTERM);
        }
    }
}

pub struct Daemon {
    pub child: Child,
    pub address: String,
    pub state: PathBuf,
    pub log: PathBuf,
}

impl Daemon {
    /// Starts the real daemon binary on `bus` with a sim file and waits until it owns its name.
    pub fn start(bus: &Bus, dir: &Path, sim: &Path, env: &[(&str, &str)]) -> Daemon {
        Daemon::start_with(bus, dir, Some(sim), env)
    }

    /// Starts the daemon with the sim file given, or with NVML (as configured in
    /// `dir/node.toml`) when `sim` is None.
    pub fn start_with(bus: &Bus, dir: &Path, sim: Option<&Path>, env: &[(&str, &str)]) -> Daemon {
        let state = dir.join("state");
        let log = dir.join("daemon.log");
        // A measurement may name another build (ASTRAEUS_TEST_DAEMON, e.g.
        // target/release/astraeusd); tests run the one cargo built.
        let daemon = std::env::var("ASTRAEUS_TEST_DAEMON")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_astraeusd").to_string());
        let mut cmd = Command::new(daemon);
        cmd.args(["--bus-address", &bus.address]);
        if let Some(sim) = sim {
            cmd.arg("--sim").arg(sim);
        }
        cmd.arg("--state-dir")
            .arg(&state)
            .arg("--config")
            .arg(dir.join("node.toml"))
            .env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        if !dir.join("node.toml").exists() {
            std::fs::write(
                dir.join("node.toml"),
                "[inventory]\nrefresh_seconds = 0.2\n",
            )
            .unwrap();
        }
        // Its own per-GPU locks (see inventory/claims.rs): daemons of tests
        // running side by side read the same fake GPUs.
        let locks = dir.join("gpu-locks");
        std::fs::create_dir_all(&locks).unwrap();
        cmd.env("ASTRAEUS_GPU_LOCK_DIR", &locks);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().unwrap();
        let d = Daemon {
            child,
            address: bus.address.clone(),
            state,
            log,
        };
        d.wait_for_name();
        d
    }

    fn wait_for_name(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let out = busctl(
                &self.address,
                &[
                    "call",
                    "org.freedesktop.DBus",
                    "/org/freedesktop/DBus",
                    "org.freedesktop.DBus",
                    "NameHasOwner",
                    "s",
                    "org.astraeus.Node1",
                ],
            );
            if out.stdout.contains("true") {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("daemon did not take its name; log:\n{}", self.log_text());
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM and wait: the clean path.
    pub fn stop(mut self) -> std::process::ExitStatus {
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let status = self.child.wait().unwrap();
        std::mem::forget(self);
        status
    }

    pub fn signal(&self, sig: i32) {
        unsafe {
            libc::kill(self.child.id() as i32, sig);
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // A failed test shows what the daemon said (its last 60 lines), so
        // a failure seen once in CI can be understood from its log.
        if std::thread::panicking() {
            let log = self.log_text();
            let lines: Vec<&str> = log.lines().collect();
            eprintln!(
                "---- the daemon's log, last {} lines ----\n{}",
                lines.len().min(60),
                lines[lines.len().saturating_sub(60)..].join("\n")
            );
        }
    }
}

pub struct Out {
    pub ok: bool,
    /// The exit code (None: killed by a signal).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// A finished command's exit, stdout and stderr.
pub fn out(o: Output) -> Out {
    Out {
        ok: o.status.success(),
        code: o.status.code(),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// Runs a command as `user` (None: as ourselves) through setpriv.
pub fn run_as(user: Option<&str>, program: &str, args: &[&str]) -> Out {
    let mut cmd = match user {
        None => Command::new(program),
        Some(u) => {
            let mut c = Command::new("setpriv");
            c.args([
                &format!("--reuid={u}"),
                &format!("--regid={}", primary_group(u)),
                "--init-groups",
                program,
            ]);
            if u == "nobody" {
                c = Command::new("setpriv");
                c.args([
                    "--reuid=nobody",
                    "--regid=nogroup",
                    "--clear-groups",
                    program,
                ]);
            }
            c
        }
    };
    out(cmd.args(args).stdin(Stdio::null()).output().unwrap())
}

fn primary_group(user: &str) -> String {
    let o = Command::new("id").args(["-gn", user]).output().unwrap();
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

pub fn busctl(address: &str, args: &[&str]) -> Out {
    busctl_as(None, address, args)
}

pub fn busctl_as(user: Option<&str>, address: &str, args: &[&str]) -> Out {
    let addr = format!("--address={address}");
    let mut all = vec![addr.as_str()];
    all.extend_from_slice(args);
    run_as(user, "busctl", &all)
}

/// `busctl call` on the Manager.
pub fn manager(address: &str, user: Option<&str>, method: &str, sig_args: &[&str]) -> Out {
    manager_with(address, user, &[], method, sig_args)
}

/// `busctl OPTIONS call` on the Manager.
fn manager_with(
    address: &str,
    user: Option<&str>,
    options: &[&str],
    method: &str,
    sig_args: &[&str],
) -> Out {
    let mut args = options.to_vec();
    args.extend_from_slice(&[
        "call",
        "org.astraeus.Node1",
        "/org/astraeus/Node1",
        "org.astraeus.Node1.Manager",
        method,
    ]);
    args.extend_from_slice(sig_args);
    busctl_as(user, address, &args)
}

/// `busctl call` of a Manager method taking one spec (`s`), as `user`,
/// waiting at most `timeout_s` seconds for the answer.
pub fn manager_spec_within(
    address: &str,
    user: Option<&str>,
    timeout_s: u32,
    method: &str,
    spec: &str,
) -> Out {
    let timeout = format!("--timeout={timeout_s}");
    manager_with(address, user, &[&timeout], method, &["s", spec])
}

pub fn gdbus(address: &str, args: &[&str]) -> Out {
    let mut all = vec!["call", "--address", address, "-d", "org.astraeus.Node1"];
    all.extend_from_slice(args);
    run_as(None, "gdbus", &all)
}

/// gdbus calling a Manager method (it parses the arguments' types itself).
pub fn gdbus_manager(address: &str, method: &str, args: &[&str]) -> Out {
    let method = format!("org.astraeus.Node1.Manager.{method}");
    let mut all = vec!["-o", "/org/astraeus/Node1", "-m", method.as_str()];
    all.extend_from_slice(args);
    gdbus(address, &all)
}

pub fn ctl(address: &str, user: Option<&str>, args: &[&str]) -> Out {
    let mut all = vec!["--bus-address", address];
    all.extend_from_slice(args);
    run_as(user, env!("CARGO_BIN_EXE_astraeusctl"), &all)
}

/// astraeusctl as the caller, in the time zone `zone` ($TZ).
pub fn ctl_tz(address: &str, zone: &str, args: &[&str]) -> Out {
    let mut all = vec!["--bus-address", address];
    all.extend_from_slice(args);
    out(Command::new(env!("CARGO_BIN_EXE_astraeusctl"))
        .args(&all)
        .env("TZ", zone)
        .stdin(Stdio::null())
        .output()
        .unwrap())
}

/// A domain for libvirt's test driver.
pub const TEST_DOMAIN: &str = "<domain type='test'><name>base</name><memory>65536</memory>\
    <os><type>hvm</type></os><devices/></domain>";

/// A VM worker's request: `gpus` whole GPUs (none when 0), one core, `xml`.
pub fn vm_spec(name: &str, gpus: u32, xml: &str) -> String {
    let gpu = if gpus > 0 {
        format!(r#""gpu_requests":{{"count":{gpus}}},"#)
    } else {
        String::new()
    };
    format!(
        r#"{{"name":"{name}","requested_resources":{{{gpu}"cpu_cores":1}},"run":{{"vm":{{"domain_xml":{}}}}}}}"#,
        serde_json::to_string(xml).unwrap()
    )
}

pub fn shared_spec(name: &str, gb: &str) -> String {
    format!(
        r#"{{"name":"{name}","requested_resources":{{"gpu_requests":{{"count":1,"shared":true,"memory_gb":{gb}}}}}}}"#
    )
}

/// A temp dir other users can enter (sockets, sim files).
pub fn open_tempdir() -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix("astraeus-test")
        .tempdir()
        .unwrap();
    let _ = Command::new("chmod").arg("755").arg(d.path()).status();
    d
}

/// The daemon on `bus` with the simulated machine majin and `config` as its
/// node.toml, both written into `dir`.
pub fn start_majin(bus: &Bus, dir: &Path, config: &str, env: &[(&str, &str)]) -> Daemon {
    std::fs::write(dir.join("node.toml"), config).unwrap();
    std::fs::write(dir.join("majin.toml"), MAJIN_TOML).unwrap();
    Daemon::start(bus, dir, &dir.join("majin.toml"), env)
}

/// A zbus client on `address`, with the runtime to block on its calls.
pub fn blocking_client(address: &str) -> (tokio::runtime::Runtime, zbus::Connection) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let conn = rt
        .block_on(zbus::connection::Builder::address(address).build())
        .unwrap();
    (rt, conn)
}

pub fn is_root() -> bool {
    unsafe { libc::geteuid() == 0 }
}

/// Polls until `f` holds or the deadline passes.
pub fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    // Generous: a loaded CI machine starts containers and VMs slowly; a
    // passing test never waits this long.
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out waiting for: {what}");
}

/// A worker's State property as busctl prints it (`s "running"\n`).
pub fn state(a: &str, name: &str) -> String {
    busctl(
        a,
        &[
            "get-property",
            "org.astraeus.Node1",
            &format!("/org/astraeus/Node1/worker/{name}"),
            "org.astraeus.Node1.Worker",
            "State",
        ],
    )
    .stdout
}

/// A careless bus policy that lets everyone call everything: the daemon's
/// own checks are then all that stands between a caller and a mutation.
pub fn careless_policy(dir: &Path) -> PathBuf {
    let path = dir.join("open.conf");
    std::fs::write(
        &path,
        r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig><policy context="default"><allow own="org.astraeus.Node1"/><allow send_destination="org.astraeus.Node1"/></policy></busconfig>"#,
    )
    .unwrap();
    path
}

/// Every method of the committed introspection XML: (interface, method, in-arg types).
pub fn methods_in_xml() -> Vec<(String, String, Vec<String>)> {
    let xml = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/dbus/org.astraeus.Node1.xml"
    ))
    .unwrap();
    let mut out = Vec::new();
    let mut iface = String::new();
    let mut current: Option<(String, String, Vec<String>)> = None;
    for line in xml.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("<interface name=\"") {
            iface = rest.split('"').next().unwrap().to_string();
        } else if let Some(rest) = line.strip_prefix("<method name=\"") {
            let name = rest.split('"').next().unwrap().to_string();
            current = Some((iface.clone(), name, Vec::new()));
            if line.ends_with("/>") {
                out.push(current.take().unwrap());
            }
        } else if line.starts_with("<arg ") && line.contains("direction=\"in\"") {
            let ty = line
                .split("type=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap();
            current.as_mut().unwrap().2.push(ty.to_string());
        } else if line == "</method>" {
            out.push(current.take().unwrap());
        }
    }
    out
}

/// Whether a worker's object is gone from the bus (it ended).
/// The daemon answers that no live worker has this name (a daemon that
/// does not answer at all is no proof: that fails the test).
pub fn gone(a: &str, name: &str) -> bool {
    let o = manager(a, None, "GetWorker", &["s", name]);
    if o.ok {
        return false;
    }
    assert!(
        o.stderr.contains("no live worker named"),
        "the daemon did not answer whether {name} is gone: {}",
        o.stderr
    );
    true
}

/// ASTRAEUS_REQUIRE_COMPONENTS set to anything but "" or "0".
pub fn components_required() -> bool {
    std::env::var("ASTRAEUS_REQUIRE_COMPONENTS").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Whether a real component a test needs is here. When it is missing the
/// test is skipped (it says so on stderr), or fails when
/// ASTRAEUS_REQUIRE_COMPONENTS=1 is set, as CI sets it: there, a missing
/// component is a broken setup, not a reason to pass.
pub fn require_component(present: bool, what: &str) -> bool {
    if !present {
        assert!(
            !components_required(),
            "needs {what}, which is missing, and ASTRAEUS_REQUIRE_COMPONENTS is set"
        );
        eprintln!("SKIPPED: needs {what}");
    }
    present
}

/// A template object's State, as busctl prints it, unquoted.
pub fn template_state(a: &str, name: &str) -> String {
    busctl(
        a,
        &[
            "get-property",
            "org.astraeus.Node1",
            &format!("/org/astraeus/Node1/template/{name}"),
            "org.astraeus.Node1.Template",
            "State",
        ],
    )
    .stdout
    .trim()
    .trim_start_matches("s ")
    .trim_matches('"')
    .to_string()
}

/// A free loopback TCP port for a daemon to listen on, below the kernel's
/// ephemeral range: a port the kernel handed out (bind to :0) could be
/// given next to some test's outgoing connection before the daemon bound
/// it (CI saw "Address already in use"). Each call of a test binary takes
/// the next port of its own sequence, checked free.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    let (low, span) = (10_000, ephemeral.saturating_sub(10_000).max(1_000));
    let start = (u64::from(std::process::id()) * 7_919 % u64::from(span)) as u32;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (low + start.wrapping_add(n.wrapping_mul(13)) % span) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// node.toml lines that give the daemon libvirt's test driver (in-process:
/// each daemon has its own, empty at start).
/// Templates with no baseboard are allowed there (trials), as most tests'
/// test-driver domains have no hostdev.
pub const TEST_DRIVER: &str =
    "[runtime]\nlibvirt_uri = \"test:///default\"\n[slicing]\nallow_no_baseboard = true\n";

/// A template whose persistent VM is `tmpl-NAME` on libvirt's test driver,
/// owning the baseboard 0000:41:00.0.
pub fn test_template(name: &str) -> String {
    let xml = format!(
        "<domain type='test'><name>tmpl-{name}</name><memory>65536</memory>\
         <os><type>hvm</type></os><devices><hostdev mode='subsystem' type='pci' managed='yes'>\
         <source><address domain='0x0000' bus='0x41' slot='0x00' function='0x0'/></source>\
         </hostdev></devices></domain>"
    );
    serde_json::json!({
        "name": name,
        "workload": {"model": "Llama-3.1-8B", "runtime": "vllm"},
        "user": {"kind": if name == "a" { "internal" } else { "external" }, "name": "team-".to_string() + name},
        "vm": {"domain_xml": xml},
        "baseboard": ["0000:41:00.0"],
    })
    .to_string()
}

/// Defines [`test_template`] NAME on the daemon at `a` (as root).
pub fn define_template(a: &str, name: &str) {
    let o = manager(a, None, "CreateTemplate", &["s", &test_template(name)]);
    assert!(o.ok, "CreateTemplate {name}: {}", o.stderr);
}

/// Runs a test script in a private mount namespace (it mounts over /run and
/// /var paths, so it needs root, as CI has); passes when it ends well and
/// prints `ok_line`. The script's output is the failure message.
pub fn run_in_private_mounts(script: &str, args: &[&str], ok_line: &str) {
    assert!(
        is_root(),
        "this test mounts in a private namespace: run the suite as root (as CI does)"
    );
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "bash", script])
        .args(args)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains(ok_line), "{text}");
}

/// The bus policy the packages install.
pub fn policy_file() -> &'static Path {
    Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/dbus/org.astraeus.Node1.conf"
    ))
}

/// A local user in group `astraeus` (created when missing); its uid.
pub fn ensure_user(name: &str) -> u32 {
    let _ = Command::new("groupadd").args(["-f", "astraeus"]).status();
    if !Command::new("id")
        .arg(name)
        .output()
        .unwrap()
        .status
        .success()
    {
        let st = Command::new("useradd")
            .args([
                "-M",
                "-N",
                "-g",
                "astraeus",
                "-s",
                "/usr/sbin/nologin",
                name,
            ])
            .status()
            .unwrap();
        assert!(st.success(), "useradd {name}");
    }
    let o = Command::new("id").args(["-u", name]).output().unwrap();
    String::from_utf8_lossy(&o.stdout).trim().parse().unwrap()
}

/// dbus-monitor on `address` writing what matches `rule` to `log`, returned
/// once it is subscribed: the bus takes its name away (NameLost) when it
/// becomes a monitor, and signals from then on are all in the log.
pub fn monitor(address: &str, rule: &str, log: &Path) -> Child {
    let child = Command::new("dbus-monitor")
        .args(["--address", address, rule])
        .stdout(std::fs::File::create(log).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    eventually("dbus-monitor subscribed", || {
        std::fs::read_to_string(log).is_ok_and(|s| s.contains("member=NameLost"))
    });
    child
}

/// One raw HTTP request to 127.0.0.1:`port`: (status, head, body).
pub fn http(port: u16, request: &str) -> (u16, String, String) {
    http_from(std::net::Ipv4Addr::LOCALHOST, port, request)
}

/// A connection to 127.0.0.1:`port` from the loopback address `from`
/// (127.0.0.2 is another client to the daemon: the kernel answers all of
/// 127/8 on lo).
pub fn connect_from(from: std::net::Ipv4Addr, port: u16) -> std::net::TcpStream {
    use std::os::unix::io::FromRawFd;
    // SAFETY: a socket made, bound and connected with valid addresses of
    // the sizes given; owned by the stream returned.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0);
        let addr = |ip: std::net::Ipv4Addr, port: u16| libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(ip).to_be(),
            },
            sin_zero: [0; 8],
        };
        let size = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let local = addr(from, 0);
        assert_eq!(
            libc::bind(fd, (&local as *const libc::sockaddr_in).cast(), size),
            0
        );
        let remote = addr(std::net::Ipv4Addr::LOCALHOST, port);
        let r = libc::connect(fd, (&remote as *const libc::sockaddr_in).cast(), size);
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
        std::net::TcpStream::from_raw_fd(fd)
    }
}

/// [`http`] from the loopback address `from`.
pub fn http_from(from: std::net::Ipv4Addr, port: u16, request: &str) -> (u16, String, String) {
    use std::io::{Read, Write};
    let mut s = connect_from(from, port);
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .unwrap_or("0")
        .parse()
        .unwrap();
    (status, head.to_string(), body.to_string())
}

/// GET `path` from 127.0.0.1:`port`: (status, head, body).
pub fn get(port: u16, path: &str) -> (u16, String, String) {
    http(
        port,
        &format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n"),
    )
}

/// Whether a container engine's API (podman's, Docker's) answers `GET /_ping` with 200 on `sock`.
pub fn pinged(sock: &Path) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::os::unix::net::UnixStream::connect(sock) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(2)));
    if s.write_all(b"GET /_ping HTTP/1.1\r\nHost: d\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut answer = [0u8; 12];
    s.read_exact(&mut answer).is_ok() && &answer == b"HTTP/1.1 200"
}
