#!/usr/bin/env bash
# The session daemon's home (#51), under a real systemd user manager in a
# private mount namespace, with the user unit as the package installs it
# (only its ExecStart pointed at this build and the simulated machine):
#   unshare --mount --propagation private bash tests/session_home.sh ASTRAEUSD ASTRAEUSCTL SIM_FILE
# - An older build's ledger in ~/.config/astraeus (where systemd < 254 maps
#   a user unit's StateDirectory=; this machine's systemd 252 still does),
#   left with its log unmerged by a kill, is carried over once to
#   ~/.local/state/astraeus, every row kept, and the old file set aside.
# - The system's /etc/astraeus/node.toml is never read: its [http] listen
#   is not served.
# - As a desktop user meets it (item 7): with the notification unit as
#   installed and a real notification server (dunst on Xvfb) on the
#   session bus, `astraeusctl --session` submits, its worker is written in
#   the ledger's one home, and being placed after waiting raises a
#   notification.
set -euo pipefail
daemon=$1 ctl=$2 sim=$3
here=$(cd "$(dirname "$0")/.." && pwd)
rt=$(mktemp -d /var/lib/astraeus-home.XXXXXX)
# The units run with PrivateTmp=yes: a build under /tmp (a checkout there)
# is hidden from them, so they run a copy here, where the package would
# put it (#68).
install -m 755 "$daemon" "$rt/astraeusd"
install -m 755 "$ctl" "$rt/astraeusctl"
daemon=$rt/astraeusd ctl=$rt/astraeusctl
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
old_pid= desktop=()
cleanup() {
    [ -n "$old_pid" ] && kill -9 "$old_pid" 2>/dev/null
    systemctl --user stop astraeus-notify astraeusd 2>/dev/null || true
    for p in "${desktop[@]}"; do kill "$p" 2>/dev/null || true; done
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

echo "== a desktop user: astraeusctl --session submits, astraeus-notify says what happened"
# A display and a notification server on the session bus, as a desktop has.
n=$(for n in $(seq 40 90); do [ -e "/tmp/.X11-unix/X$n" ] || { echo "$n"; break; }; done)
Xvfb ":$n" -nolisten tcp -ac > /dev/null 2>&1 &
desktop+=("$!")
for _ in $(seq 200); do [ -e "/tmp/.X11-unix/X$n" ] && break; sleep 0.1; done
printf '[global]\n' > "$rt/dunstrc"
DISPLAY=":$n" dunst -config "$rt/dunstrc" > /dev/null 2>&1 &
desktop+=("$!")
for _ in $(seq 200); do
    [ "$(busctl --user call org.freedesktop.DBus /org/freedesktop/DBus org.freedesktop.DBus \
        NameHasOwner s org.freedesktop.Notifications 2>/dev/null)" = "b true" ] && break
    sleep 0.1
done
# The agent's unit as installed, pointed at this build; ProtectHome= is
# what this sandbox cannot set up (226/NAMESPACE), nothing else changes.
sed -e "s|^ExecStart=.*|ExecStart=$ctl notify|" -e '/^ProtectHome=/d' \
    "$here/systemd/astraeus-notify.service" > /root/.config/systemd/user/astraeus-notify.service
# A drop-in keeps what the agent says, to know when it follows the daemon.
mkdir -p /root/.config/systemd/user/astraeus-notify.service.d
printf '[Service]\nStandardOutput=file:%s\n' "$rt/agent.log" \
    > /root/.config/systemd/user/astraeus-notify.service.d/log.conf
systemctl --user daemon-reload
systemctl --user start astraeus-notify || fail "the notification unit did not start"
for _ in $(seq 100); do grep -q 'following the daemon on the session bus' "$rt/agent.log" 2>/dev/null && break; sleep 0.1; done
grep -q 'following the daemon on the session bus' "$rt/agent.log" \
    || fail "the agent does not follow the session daemon: $(cat "$rt/agent.log" 2>&1)"
shown() { dunstctl close-all >/dev/null 2>&1; dunstctl history 2>/dev/null; }
spec() { printf '{"name":"%s","requested_resources":{"gpu_requests":{"shared":true,"memory_gb":%s}}}' "$1" "$2" > "$rt/$1.json"; }
# 7 GB offered, 2 taken by kept-1, kept-2 and after: 4 runs, 2 waits.
spec big 4; spec small 2
"$ctl" --session submit "$rt/big.json" > /dev/null || fail "astraeusctl --session submit big"
"$ctl" --session submit "$rt/small.json" > /dev/null || fail "astraeusctl --session submit small"
"$ctl" --session workers | grep -qE '^small +pending' || fail "small does not wait: $("$ctl" --session workers)"
"$ctl" --session stop big > /dev/null
for _ in $(seq 100); do shown | grep -q 'small is placed' && break; sleep 0.2; done
shown | grep -q 'small is placed' || fail "no notification: $(shown); agent: $(systemctl --user status astraeus-notify --no-pager 2>&1 | tail -5)"
sqlite3 "file:$new/ledger.db?mode=ro" "SELECT count(*) FROM workers WHERE name = 'small'" | grep -qx 1 \
    || fail "small is not in the ledger at $new"
echo "session home: ok"
