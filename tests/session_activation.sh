#!/usr/bin/env bash
# Session-bus activation like the system side (#51, item 4), under a real
# systemd user manager and its own session bus (dbus-user-session's
# dbus.socket, with systemd activation), in a private mount namespace, with the user
# unit and the D-Bus service file as the package installs them (only the
# unit's ExecStart pointed at this build and the simulated machine):
#   unshare --mount --propagation private bash tests/session_activation.sh ASTRAEUSD ASTRAEUSCTL SIM_FILE
# - A call on the session bus does not start a daemon whose unit the user
#   has not enabled; `astraeusctl page` does not start one either.
# - Once enabled, the first call starts it; `astraeusctl page` then gives
#   the address the daemon reports.
set -euo pipefail
daemon=$1 ctl=$2 sim=$3
here=$(cd "$(dirname "$0")/.." && pwd)
rt=$(mktemp -d /var/lib/astraeus-activation.XXXXXX)
# The units run with PrivateTmp=yes: a build under /tmp (a checkout there)
# is hidden from them, so they run a copy here, where the package would
# put it (#68).
install -m 755 "$daemon" "$rt/astraeusd"
install -m 755 "$ctl" "$rt/astraeusctl"
daemon=$rt/astraeusd ctl=$rt/astraeusctl
home=$rt/home
mkdir -p "$rt/run-systemd/system" "$home/.config/systemd/user" "$home/.config/astraeus"
mount --bind "$rt/run-systemd" /run/systemd
mount --bind "$home" /root
export HOME=/root XDG_RUNTIME_DIR=$rt DBUS_SESSION_BUS_ADDRESS=unix:path=$rt/bus
unset XDG_CONFIG_HOME XDG_STATE_HOME XDG_DATA_HOME
# The session bus is the user manager's own (dbus-user-session: its
# dbus.socket on $XDG_RUNTIME_DIR/bus, dbus-daemon --systemd-activation),
# which reads session service files from ~/.local/share/dbus-1/services:
# the package's file goes there, as /usr/share/dbus-1/services has it.
[ -f /usr/lib/systemd/user/dbus.socket ] || { echo "FAIL: needs dbus-user-session (the user manager's session bus)"; exit 1; }
mkdir -p /root/.local/share/dbus-1/services
cp "$here/dbus/org.astraeus.Node1.user.service" /root/.local/share/dbus-1/services/org.astraeus.Node1.service
/lib/systemd/systemd --user > "$rt/manager.log" 2>&1 &
manager=$!
cleanup() {
    systemctl --user stop astraeusd 2>/dev/null || true
    kill "$manager" 2>/dev/null || true
    umount /root /run/systemd 2>/dev/null || true
    rm -rf "$rt"
}
trap cleanup EXIT
fail() {
    echo "FAIL: $*"
    systemctl --user status astraeusd --no-pager -l 2>&1 | tail -30 || true
    tail -20 "$rt/manager.log"
    exit 1
}
for _ in $(seq 300); do systemctl --user is-system-running >/dev/null 2>&1 && break; sleep 0.1; done
cp "$sim" "$rt/majin.toml"
port=$((20000 + RANDOM % 20000))
printf '[http]\nlisten = "127.0.0.1:%s"\n' "$port" > /root/.config/astraeus/node.toml
sed "s|^ExecStart=.*|ExecStart=$daemon --session --sim $rt/majin.toml|" \
    "$here/systemd/astraeusd-user.service" > /root/.config/systemd/user/astraeusd.service
systemctl --user daemon-reload
call() { busctl --user --timeout=20 call org.astraeus.Node1 /org/astraeus/Node1 org.astraeus.Node1.Manager "$@"; }

echo "== not enabled: a call on the session bus starts nothing"
if out=$(call ListGpus 2>&1); then fail "a call started a daemon its user did not enable: $out"; fi
echo "refused: $out"
echo "$out" | grep -q 'dbus-org.astraeus.Node1.service' || fail "the refusal does not name the unit's alias: $out"
[ "$(systemctl --user is-active astraeusd)" = inactive ] || fail "the unit runs"
set +e
page=$("$ctl" page --print 2>&1)
code=$?
set -e
[ "$code" = 69 ] || fail "astraeusctl page with no daemon exits $code: $page"
echo "$page" | grep -q 'no astraeusd runs for you' || fail "astraeusctl page says: $page"
[ "$(systemctl --user is-active astraeusd)" = inactive ] || fail "astraeusctl page started the unit"

echo "== enabled: the first call starts it"
systemctl --user enable astraeusd 2>&1
[ -L /root/.config/systemd/user/dbus-org.astraeus.Node1.service ] || fail "enabling made no alias"
call ListGpus > /dev/null || fail "the call did not start the enabled unit"
[ "$(systemctl --user is-active astraeusd)" = active ] || fail "the unit is $(systemctl --user is-active astraeusd)"

echo "== astraeusctl page: the address the running daemon reports"
[ "$("$ctl" page --print)" = "http://127.0.0.1:$port/" ] || fail "page --print: $("$ctl" page --print 2>&1)"
echo "session activation: ok"
