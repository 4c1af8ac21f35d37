#!/usr/bin/env bash
# GPU locks any user can take (#51, item 3), on a /run as upstream systemd
# makes it (/run/lock 0755 root), in a private mount namespace:
#   unshare --mount --propagation private bash tests/lock_dir.sh ASTRAEUSD NVML_LIB FIXTURE TMPFILES USER
# - Without the package's lock directory a user's daemon cannot create its
#   locks, manages no GPU, and says the real error and what to run.
# - The package's tmpfiles.d line (run as the package runs it) makes
#   /run/astraeus-locks; the user's daemon then manages every GPU.
# - The system daemon takes its locks there too: a user's daemon finds them
#   held and names the holder.
set -euo pipefail
daemon=$1 lib=$2 fixture=$3 tmpfiles=$4 user=$5
rt=$(mktemp -d /var/tmp/astraeus-locks.XXXXXX)
chmod 0755 "$rt"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    umount /run 2>/dev/null || true
    rm -rf "$rt"
}
trap cleanup EXIT
fail() {
    echo "FAIL: $*"
    for f in "$rt"/*.log; do echo "--- $f"; tail -20 "$f"; done
    exit 1
}
# Upstream systemd's /run: /run/lock is root's, 0755.
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -m 0755 /run/lock
cp "$fixture" "$rt/gpus.txt"
chmod 0644 "$rt/gpus.txt"
printf 'machine = "majin"\n[inventory]\nrefresh_seconds = 0.2\nwsl = false\nnvml_library = "%s"\n' "$lib" > "$rt/node.toml"
chmod 0644 "$rt/node.toml"
as_user() { setpriv --reuid="$user" --regid="$(id -g "$user")" --clear-groups env HOME="$rt/home" "$@"; }
mkdir -p "$rt/home" "$rt/user-state"
chown "$user" "$rt/home" "$rt/user-state"
export FAKE_NVML_FIXTURE=$rt/gpus.txt
# The user's own session bus; no system bus the user may reach.
as_user dbus-daemon --session --address="unix:path=$rt/home/bus" --fork --print-pid=1 > "$rt/user-bus.pid"
pids+=("$(cat "$rt/user-bus.pid")")
user_bus=unix:path=$rt/home/bus
user_daemon() {
    # setpriv and env exec the daemon: $! is the daemon (a function run
    # in the background would be a subshell, and the kill miss it).
    setpriv --reuid="$user" --regid="$(id -g "$user")" --clear-groups env HOME="$rt/home" \
        DBUS_SYSTEM_BUS_ADDRESS=unix:path=/nonexistent DBUS_SESSION_BUS_ADDRESS="$user_bus" \
        "$daemon" --session --state-dir "$rt/user-state" --config "$rt/node.toml" 2> "$rt/$1.log" &
    user_pid=$!
    pids+=("$user_pid")
    for _ in $(seq 200); do
        as_user busctl --address="$user_bus" status org.astraeus.Node1 >/dev/null 2>&1 && return
        sleep 0.1
    done
    fail "the user's daemon did not take its name"
}
gpus() {
    as_user busctl --address="$user_bus" call org.astraeus.Node1 /org/astraeus/Node1 \
        org.astraeus.Node1.Manager ListGpus | cut -d' ' -f2
}
stop_user() { kill "$user_pid"; wait "$user_pid" 2>/dev/null || true; }

echo "== no lock directory of the package's: the real error, and what to run"
user_daemon no-dir
[ "$(gpus)" = 0 ] || fail "a daemon that cannot lock manages $(gpus) GPUs"
for _ in $(seq 50); do grep -q 'Permission denied' "$rt/no-dir.log" && break; sleep 0.1; done
grep -q '/run/lock/astraeusd-gpu-GPU-4060.lock cannot be taken (Permission denied' "$rt/no-dir.log" \
    || fail "the refusal does not name the real error"
grep -q 'systemd-tmpfiles --create astraeusd.conf' "$rt/no-dir.log" || fail "no hint of the package's lock directory"
if grep -q 'managed by another astraeusd' "$rt/no-dir.log"; then fail "a false reason: no other daemon runs"; fi
stop_user

echo "== the package's tmpfiles.d line makes the directory; the user's daemon manages both GPUs"
cp "$tmpfiles" /tmp/astraeusd.conf.$$
systemd-tmpfiles --create /tmp/astraeusd.conf.$$
rm -f /tmp/astraeusd.conf.$$
[ "$(stat -c '%a %U' /run/astraeus-locks)" = "1777 root" ] || fail "made as $(stat -c '%a %U' /run/astraeus-locks)"
user_daemon packaged
for _ in $(seq 100); do [ "$(gpus)" = 2 ] && break; sleep 0.1; done
[ "$(gpus)" = 2 ] || fail "the user's daemon manages $(gpus) GPUs"
[ "$(stat -c '%U' /run/astraeus-locks/astraeusd-gpu-GPU-4060.lock)" = "$user" ] || fail "the lock is not the user's"
stop_user

echo "== the system daemon locks there too; a user's daemon names it"
mkdir -p "$rt/system-state"
dbus-daemon --session --address="unix:path=$rt/system-bus" --fork --print-pid=1 > "$rt/system-bus.pid"
pids+=("$(cat "$rt/system-bus.pid")")
DBUS_SYSTEM_BUS_ADDRESS=unix:path=$rt/system-bus "$daemon" --state-dir "$rt/system-state" \
    --config "$rt/node.toml" 2> "$rt/system.log" &
pids+=("$!")
# Its GPUs are read, and locked, before it takes its name.
for _ in $(seq 200); do
    busctl --address="unix:path=$rt/system-bus" status org.astraeus.Node1 >/dev/null 2>&1 && break
    sleep 0.1
done
# Held (the file may be the user's daemon's, left from before).
if flock -n /run/astraeus-locks/astraeusd-gpu-GPU-L4.lock true; then fail "the system daemon took no lock there"; fi
user_daemon beside-system
[ "$(gpus)" = 0 ] || fail "the user's daemon manages $(gpus) GPUs the system daemon holds"
for _ in $(seq 50); do grep -q 'managed by another astraeusd' "$rt/beside-system.log" && break; sleep 0.1; done
grep -q 'GPU GPU-4060 is managed by another astraeusd (/run/astraeus-locks/astraeusd-gpu-GPU-4060.lock: held by astraeusd (pid [0-9]*, uid 0))' \
    "$rt/beside-system.log" || fail "the holder is not named"
stop_user
echo "lock directory: ok"
