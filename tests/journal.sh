#!/usr/bin/env bash
# The journal as an operator reads it: a real systemd-journald in a private
# mount namespace (recipe in shared/test-environment.md), the daemon logging
# to it, and journalctl asked the way the README and the catalog say.
# Run by tests/journal.rs as:
#   unshare --mount --propagation private bash tests/journal.sh ASTRAEUSD CATALOG
set -euo pipefail
daemon=$1 catalog=$2
rt=$(mktemp -d /var/lib/astraeus-journal.XXXXXX)
mkdir -p "$rt/run-systemd" "$rt/run-log" "$rt/varlog" "$rt/catalog-db" "$rt/catalogs" "$rt/state"
mount --bind "$rt/run-systemd" /run/systemd
mkdir -p /run/log /var/log/journal /var/lib/systemd/catalog /usr/lib/systemd/catalog
mount --bind "$rt/run-log" /run/log
mount --bind "$rt/varlog" /var/log/journal
mount --bind "$rt/catalog-db" /var/lib/systemd/catalog
cp /usr/lib/systemd/catalog/*.catalog "$rt/catalogs/" 2>/dev/null || true
cp "$catalog" "$rt/catalogs/"
mount --bind "$rt/catalogs" /usr/lib/systemd/catalog
mkdir -p /run/systemd/journal
/lib/systemd/systemd-journald > "$rt/journald.log" 2>&1 &
journald=$!
daemon_pid= bus_pid=
cleanup() {
    [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null
    [ -n "$bus_pid" ] && kill "$bus_pid" 2>/dev/null
    kill "$journald" 2>/dev/null || true
    umount /usr/lib/systemd/catalog /var/lib/systemd/catalog /var/log/journal /run/log /run/systemd 2>/dev/null || true
    rm -rf "$rt"
}
trap cleanup EXIT
fail() { echo "journal: FAIL: $*"; journalctl --no-pager -o verbose SYSLOG_IDENTIFIER=astraeusd | tail -60; exit 1; }
for _ in $(seq 300); do [ -S /run/systemd/journal/socket ] && break; sleep 0.1; done
[ -S /run/systemd/journal/socket ] || fail "journald did not start: $(cat "$rt/journald.log")"
journalctl --update-catalog

read -r addr bus_pid < <(dbus-daemon --session --print-address=1 --print-pid=1 --fork | paste -sd' ')
export DBUS_SESSION_BUS_ADDRESS=$addr
# majin as a file (its outside use changes below) and libvirt's test driver
# (a template's handoff steps).
cat > "$rt/majin.toml" <<'SIM'
machine = "majin"
[[gpu]]
model = "NVIDIA GeForce RTX 4060"
total_gb = 8
outside_gb = 1
SIM
printf '[schedule]\nhandoff_buffer_seconds = 0\n[runtime]\nlibvirt_uri = "test:///default"\n[slicing]\nallow_no_baseboard = true\n' > "$rt/node.toml"
# The ledger refuses a power-off's step (as a full disk would): below.
ASTRAEUS_FAILPOINTS=store.step.power-off-asked=fail \
    "$daemon" --session --sim "$rt/majin.toml" --state-dir "$rt/state" --config "$rt/node.toml" 2>"$rt/daemon.stderr" &
daemon_pid=$!
for _ in $(seq 300); do busctl --user status org.astraeus.Node1 >/dev/null 2>&1 && break; sleep 0.1; done
call() { busctl --user call org.astraeus.Node1 /org/astraeus/Node1 org.astraeus.Node1.Manager "$@"; }
call SubmitWorker s '{"name":"listen","requested_resources":{"gpu_requests":{"shared":true,"memory_gb":2.2}}}' >/dev/null
call SubmitWorker s '{"name":"voice","requested_resources":{"gpu_requests":{"shared":true,"memory_gb":4.2}}}' >/dev/null
call SubmitWorker s '{"name":"small","requested_resources":{"gpu_requests":{"shared":true,"memory_gb":1.5}}}' >/dev/null
call StopWorker s voice >/dev/null

placed=289c420c04474b6894f80da2da49d6c0 pending=c333d8604cae4623bc6d1d18f2136927 exited=3f42d4092f59400783976b9f3a69e65d
# small is placed last (when voice ends): once journald has that line, it has the rest.
for _ in $(seq 300); do
  [ -n "$(journalctl --no-pager -o cat MESSAGE_ID=$placed WORKER=small)" ] && break; sleep 0.1
done
# The README's query, as written: fields without prefix.
line=$(journalctl --no-pager -o cat MESSAGE_ID=$pending WORKER=small)
[ "$line" = "worker small waits: GPU 0 of majin: 6.4 of 7 GB taken by shared work; it needs 1.5" ] \
    || fail "pending line: '$line'"
grep -qx "worker voice placed: 1 · shared 4.2 GB" <<<"$(journalctl --no-pager -o cat MESSAGE_ID=$placed WORKER=voice)" \
    || fail "placed line"
grep -q "worker voice ended" <<<"$(journalctl --no-pager -o cat MESSAGE_ID=$exited WORKER=voice)" || fail "exited line"
# small is placed once voice is gone, on GPU 0.
grep -qx "    GPU=0" <<<"$(journalctl --no-pager -o verbose MESSAGE_ID=$placed WORKER=small)" || fail "GPU= field"
# No field carries tracing-journald's default prefix.
if grep -q "^    F_" <<<"$(journalctl --no-pager -o verbose SYSLOG_IDENTIFIER=astraeusd)"; then fail "F_ prefixed fields"; fi
# Info is priority 6, as systemd maps it.
prio=$(journalctl --no-pager -o verbose MESSAGE_ID=$placed WORKER=listen | sed -n 's/^    PRIORITY=//p')
[ "$prio" = 6 ] || fail "info logged at PRIORITY=$prio"
# journalctl -x explains the message from the shipped catalog.
grep -q "A worker waits for room on the GPUs" <<<"$(journalctl --no-pager -x MESSAGE_ID=$pending WORKER=small)" \
    || fail "catalog text: $(journalctl --no-pager -x MESSAGE_ID=$pending | tail -5)"

over=4a1865c810c44f068ad2733be5769b90 warning=17583ccc74d7438ab6bb45c9550a4eaa
handoff=eecdf24d752a41ea87b048282b74d465 lifecycle=c5b1cceda2054a4e9ca28d2406f9753b
seen() { for _ in $(seq 300); do [ -n "$(journalctl --no-pager -o cat "$@")" ] && return 0; sleep 0.1; done; return 1; }
grep -q "^ready on org.astraeus.Node1: " <<<"$(journalctl --no-pager -o cat MESSAGE_ID=$lifecycle)" || fail "ready line"
# The desktop takes 4 GB more: listen's 2.2 and small's 1.5 no longer fit
# the 3 GB offered (SIGHUP re-reads the GPUs).
sed -i 's/^outside_gb = 1$/outside_gb = 5/' "$rt/majin.toml"
kill -HUP "$daemon_pid"
seen MESSAGE_ID=$over GPU=0 || fail "no over-promised line"
grep -q "^GPU 0 of majin is over-promised: 3.7 GB promised to sharers" <<<"$(journalctl --no-pager -o cat MESSAGE_ID=$over GPU=0)" \
    || fail "over-promised line: $(journalctl --no-pager -o cat MESSAGE_ID=$over)"
seen MESSAGE_ID=$warning WORKER=listen || fail "no worker warning for listen"
grep -q "^worker listen: GPU 0 of majin is over-promised: 3.7 GB promised" \
    <<<"$(journalctl --no-pager -o cat MESSAGE_ID=$warning WORKER=listen)" \
    || fail "worker warning line: $(journalctl --no-pager -o cat MESSAGE_ID=$warning)"
grep -q "A worker needs attention" <<<"$(journalctl --no-pager -x MESSAGE_ID=$warning WORKER=listen)" \
    || fail "warning catalog text: $(journalctl --no-pager -x MESSAGE_ID=$warning | tail -5)"
# A template's steps carry TEMPLATE=.
call CreateTemplate s '{"name":"t","workload":{"model":"m","runtime":"r"},"user":{"kind":"internal","name":"u"},"vm":{"domain_xml":"<domain type='"'"'test'"'"'><name>jt</name><memory>65536</memory><os><type>hvm</type></os></domain>"},"baseboard":[]}' >/dev/null
call Resume sb t false >/dev/null
seen MESSAGE_ID=$handoff TEMPLATE=t || fail "no handoff step for t"
grep -q "^handoff: start-issued (from none to t)" <<<"$(journalctl --no-pager -o cat MESSAGE_ID=$handoff TEMPLATE=t)" \
    || fail "handoff line: $(journalctl --no-pager -o cat MESSAGE_ID=$handoff)"
# A handoff step the ledger refuses pauses time-slicing; it resumes by
# itself (after 5 s). Both lines under their own id, at their priorities.
paused=dd0305d237e842b7a75928c04f524508
state() { busctl --user get-property org.astraeus.Node1 /org/astraeus/Node1/template/t org.astraeus.Node1.Template State; }
for _ in $(seq 300); do [ "$(state)" = 's "running"' ] && break; sleep 0.1; done
[ "$(state)" = 's "running"' ] || fail "t not running: $(state)"
if call PowerOff sb t false >/dev/null 2>&1; then fail "a power-off whose step was refused was answered ok"; fi
seen MESSAGE_ID=$paused || fail "no pause line"
grep -q "^time-slicing: .*power-off-asked.*; paused: it starts again" <<<"$(journalctl --no-pager -o cat MESSAGE_ID=$paused)" \
    || fail "pause line: $(journalctl --no-pager -o cat MESSAGE_ID=$paused)"
prio=$(journalctl --no-pager -o verbose MESSAGE_ID=$paused | sed -n 's/^    PRIORITY=//p' | head -1)
[ "$prio" = 3 ] || fail "the pause logged at PRIORITY=$prio"
grep -q "Time-slicing paused, or resumed after a pause" <<<"$(journalctl --no-pager -x MESSAGE_ID=$paused)" \
    || fail "pause catalog text: $(journalctl --no-pager -x MESSAGE_ID=$paused | tail -5)"
for _ in $(seq 300); do
    grep -q "^time-slicing resumes after its pause" <<<"$(journalctl --no-pager -o cat MESSAGE_ID=$paused)" && break; sleep 0.1
done
grep -q "^time-slicing resumes after its pause" <<<"$(journalctl --no-pager -o cat MESSAGE_ID=$paused)" \
    || fail "no resume line: $(journalctl --no-pager -o cat MESSAGE_ID=$paused)"
# A clean stop says so.
kill -TERM "$daemon_pid"; wait "$daemon_pid" || true; daemon_pid=
seen MESSAGE_ID=$lifecycle || fail "lifecycle"
grep -q "^stopping; the ledger is closed cleanly" <<<"$(journalctl --no-pager -o cat MESSAGE_ID=$lifecycle)" || fail "stopping line"
echo "journal: OK"
