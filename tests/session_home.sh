#!/usr/bin/env bash
# The session daemon's home (#51), under a real systemd user manager in a
# private mount namespace, with the user unit as the package installs it
# (only its ExecStart pointed at this build and the simulated machine):
#   unshare --mount --propagation private bash tests/session_home.sh ASTRAEUSD SIM_FILE
# - An older build's ledger in ~/.config/astraeus (where systemd < 254 maps
#   a user unit's StateDirectory=; this machine's systemd 252 still does),
#   left with its log unmerged by a kill, is carried over once to
#   ~/.local/state/astraeus, every row kept, and the old file set aside.
# - The system's /etc/astraeus/node.toml is never read: its [http] listen
#   is not served.
set -euo pipefail
daemon=$1 sim=$2
here=$(cd "$(dirname "$0")/.." && pwd)
rt=$(mktemp -d /var/lib/astraeus-home.XXXXXX)
home=$rt/home
mkdir -p "$rt/run-systemd/system" "$home/.config/systemd/user" "$rt/etc"
mount --bind "$rt/run-systemd" /run/systemd
# root's home is this test's: what systemd maps StateDirectory= from.
mount --bind "$home" /root
# A system config the session daemon must not read: a copy of /etc with it.
cp -a /etc/. "$rt/etc/"
mkdir -p "$rt/etc/astraeus"
port=$((20000 + RANDOM % 20000))
printf '[http]\nlisten = "127.0.0.1:%s"\n' "$port" > "$rt/etc/astraeus/node.toml"
mount --bind "$rt/etc" /etc
export HOME=/root XDG_RUNTIME_DIR=$rt DBUS_SESSION_BUS_ADDRESS=unix:path=$rt/bus
unset XDG_CONFIG_HOME XDG_STATE_HOME XDG_DATA_HOME
dbus-daemon --session --address="$DBUS_SESSION_BUS_ADDRESS" --fork --print-pid=1 > "$rt/dbus.pid"
/lib/systemd/systemd --user > "$rt/manager.log" 2>&1 &
manager=$!
old_pid=
cleanup() {
    [ -n "$old_pid" ] && kill -9 "$old_pid" 2>/dev/null
    systemctl --user stop astraeusd 2>/dev/null || true
    kill "$manager" "$(cat "$rt/dbus.pid")" 2>/dev/null || true
    umount /etc /root /run/systemd 2>/dev/null || true
    rm -rf "$rt"
}
trap cleanup EXIT
fail() {
    echo "FAIL: $*"
    systemctl --user status astraeusd --no-pager -l 2>&1 | tail -30 || true
    cat "$rt/old.log" 2>/dev/null | tail -20
    exit 1
}
for _ in $(seq 300); do systemctl --user is-system-running >/dev/null 2>&1 && break; sleep 0.1; done
cp "$sim" "$rt/majin.toml"
up() { for _ in $(seq 300); do busctl --user status org.astraeus.Node1 >/dev/null 2>&1 && return; sleep 0.1; done; fail "no daemon on the session bus"; }
call() { busctl --user call org.astraeus.Node1 /org/astraeus/Node1 org.astraeus.Node1.Manager "$@"; }

echo "== an older build's ledger in ~/.config/astraeus, its log unmerged"
old=/root/.config/astraeus
mkdir -p "$old"
"$daemon" --session --sim "$rt/majin.toml" --state-dir "$old" 2> "$rt/old.log" &
old_pid=$!
up
for name in kept-1 kept-2 kept-3; do
    call SubmitWorker s "{\"name\":\"$name\",\"requested_resources\":{\"gpu_requests\":{\"shared\":true,\"memory_gb\":1}}}" >/dev/null
done
call StopWorker s kept-3 >/dev/null
kill -9 "$old_pid"; wait "$old_pid" 2>/dev/null || true; old_pid=
[ -s "$old/ledger.db-wal" ] || fail "the old ledger's log was merged; the test needs it unmerged"
rows=$(sqlite3 "$old/ledger.db" "SELECT count(*) FROM workers")

echo "== the user unit as installed (systemd $(systemctl --version | head -1 | cut -d' ' -f2))"
sed "s|^ExecStart=.*|ExecStart=$daemon --session --sim $rt/majin.toml|" \
    "$here/systemd/astraeusd-user.service" > /root/.config/systemd/user/astraeusd.service
systemctl --user daemon-reload
systemctl --user start astraeusd || fail "the unit did not start"
up
new=/root/.local/state/astraeus
[ -f "$new/ledger.db" ] || fail "no ledger in ~/.local/state/astraeus: $(ls -la "$new" "$old" 2>&1)"
[ "$(stat -c %a "$new")" = 700 ] || fail "the state directory is $(stat -c %a "$new")"
[ ! -e "$old/ledger.db" ] || fail "the old ledger is still where it was"
[ -f "$old/ledger.db.carried-over" ] || fail "the old ledger was not set aside"
listed=$(call ListWorkers)
for name in kept-1 kept-2; do
    echo "$listed" | grep -q "$name" || fail "$name was not carried over: $listed"
done
[ "$(sqlite3 "file:$new/ledger.db?mode=ro" "SELECT count(*) FROM workers")" = "$rows" ] \
    || fail "not every row was carried over"

echo "== the system's node.toml is not read"
if timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port" 2>/dev/null; then
    fail "the session daemon serves on the address /etc/astraeus/node.toml names"
fi

echo "== carried over once: a restart keeps the new ledger"
call SubmitWorker s '{"name":"after","requested_resources":{"gpu_requests":{"shared":true,"memory_gb":1}}}' >/dev/null
systemctl --user restart astraeusd
up
call ListWorkers | grep -q after || fail "the restart lost the new ledger"
echo "session home: ok"
