#!/usr/bin/env bash
# WSL2 as a user meets it (#51, item 6), in a private mount namespace:
#   unshare --mount --propagation private bash tests/wsl.sh ASTRAEUSD ASTRAEUSCTL NVML_LIB FIXTURE DOC
# - /dev has WSL's GPU device /dev/dxg (beside the usual null, zero, …, and
#   /dev/net/tun, which WSL opens to everyone and rootless podman needs);
# - WSL's NVML is where WSL puts it, /usr/lib/wsl/lib/libnvidia-ml.so.1
#   (an overlay on /usr/lib adds it), and lists no processes;
# - /etc/cdi holds what `nvidia-ctk cdi generate --mode=wsl` writes: one
#   device, nvidia.com/gpu=all;
# - a user in no group runs what docs/sharing.md's step 3 starts (their
#   rootless podman's API, and astraeusd --session with no configuration),
#   then every line of the docs' step 4 as written: the daemon finds WSL and
#   its NVML, and the user's container worker runs through their podman,
#   with its share in its environment.
set -euo pipefail
daemon=$1 ctl=$2 lib=$3 fixture=$4 doc=$5
user=astraeus-wsl
id "$user" >/dev/null 2>&1 || useradd -M -N -s /usr/sbin/nologin "$user"
rt=$(mktemp -d /var/tmp/astraeus-wsl.XXXXXX)
chmod 755 "$rt"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    # Rootless podman leaves a pause process holding its user namespace.
    pkill -u "$user" 2>/dev/null || true
    for p in "${pids[@]}"; do while kill -0 "$p" 2>/dev/null; do sleep 0.05; done; done
    for _ in $(seq 50); do pgrep -u "$user" >/dev/null || break; sleep 0.1; done
    pkill -9 -u "$user" 2>/dev/null || true
    umount -l /etc/cdi 2>/dev/null || true
    umount -l /usr/lib 2>/dev/null || true
    umount -lR /dev 2>/dev/null || true
    for d in null zero full random urandom tty; do umount -l "$rt/dev/$d" 2>/dev/null || true; done
    rm -rf "$rt" || true
}
trap cleanup EXIT
fail() {
    echo "FAIL: $*"
    tail -20 "$rt/daemon.log" "$rt/podman.log" 2>/dev/null
    exit 1
}
# WSL's /dev: its GPU device, a tun anyone may open, what every program needs.
mkdir -p "$rt/dev/net"
for d in null zero full random urandom tty; do
    touch "$rt/dev/$d"
    mount --bind "/dev/$d" "$rt/dev/$d"
done
touch "$rt/dev/dxg"
mknod -m 666 "$rt/dev/net/tun" c 10 200
ln -s /proc/self/fd "$rt/dev/fd"
mount --rbind "$rt/dev" /dev
mkdir -p /dev/shm && mount -t tmpfs -o mode=1777 shm /dev/shm
# WSL's NVML, where WSL mounts it; nothing says where.
mkdir -p "$rt/lower/wsl/lib"
cp "$lib" "$rt/lower/wsl/lib/libnvidia-ml.so.1"
mount -t overlay overlay -o "lowerdir=$rt/lower:/usr/lib" /usr/lib
[ -e /dev/dxg ] && [ -f /usr/lib/wsl/lib/libnvidia-ml.so.1 ] || fail "the WSL layout is not in place"
# Step 2's CDI spec, in this namespace only.
mkdir -p "$rt/cdi"
cat > "$rt/cdi/nvidia.yaml" <<'CDI'
cdiVersion: "0.5.0"
kind: nvidia.com/gpu
devices:
- name: all
  containerEdits:
    env: ["SEEN_CDI=all"]
CDI
mount --bind "$rt/cdi" /etc/cdi 2>/dev/null || { mkdir -p /etc/cdi; mount --bind "$rt/cdi" /etc/cdi; }
# The user's home and runtime directory, as a login makes them.
home=$rt/home run=$rt/run
mkdir -p "$home/.config/containers" "$run" "$rt/locks" "$home/image/bin"
cat > "$home/.config/containers/containers.conf" <<'CONF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
cp /bin/busybox "$home/image/bin/"
for a in $(/bin/busybox --list); do [ "$a" = busybox ] || ln -s busybox "$home/image/bin/$a"; done
cp "$fixture" "$rt/gpus.txt"
chmod 644 "$rt/gpus.txt"
chown -R "$user" "$home" "$run" "$rt/locks"
chmod 700 "$run"
as_user() {
    setpriv --reuid="$user" --regid="$(id -g "$user")" --init-groups \
        env -i HOME="$home" XDG_RUNTIME_DIR="$run" PATH="$(dirname "$ctl"):/usr/sbin:/usr/bin:/sbin:/bin" \
        DBUS_SESSION_BUS_ADDRESS="unix:path=$run/bus" NO_COLOR=1 TZ=UTC "$@"
}
[ "$(as_user id -Gn)" = "$(id -gn "$user")" ] || fail "the user is in a group: $(as_user id -Gn)"
# The image the docs name, from a local tarball: no registry here.
(cd "$home" && as_user tar -C image -cf image.tar .)
as_user podman import --change 'ENV PATH=/bin' --change 'CMD ["/bin/sh"]' "$home/image.tar" \
    docker.io/library/busybox > /dev/null || fail "podman import"
# Step 3: what podman.socket and astraeusd's user unit run.
as_user podman system service --time=0 > /dev/null 2> "$rt/podman.log" &
pids+=("$!")
as_user dbus-daemon --session --address="unix:path=$run/bus" --nofork > /dev/null &
pids+=("$!")
for _ in $(seq 100); do [ -S "$run/bus" ] && [ -S "$run/podman/podman.sock" ] && break; sleep 0.1; done
as_user env FAKE_NVML_FIXTURE="$rt/gpus.txt" ASTRAEUS_GPU_LOCK_DIR="$rt/locks" \
    "$daemon" --session 2> "$rt/daemon.log" &
pids+=("$!")
for _ in $(seq 200); do
    as_user busctl --user status org.astraeus.Node1 >/dev/null 2>&1 && break
    sleep 0.1
done
grep -q 'NVML loaded from /usr/lib/wsl/lib/libnvidia-ml.so.1' "$rt/daemon.log" || fail "WSL's NVML was not the one loaded"
# Step 4, every line as the docs write it.
steps=$(awk '/^# 4\./ {on = 1; next} on && /^```/ {exit} on {print}' "$doc")
[ "$(echo "$steps" | grep -c astraeusctl)" -ge 4 ] || fail "step 4 not found in $doc"
# A second between lines, as a person typing them leaves.
out=$(cd "$home" && as_user bash -ec "trap 'sleep 1' DEBUG; $steps" 2>&1) || fail "step 4 failed: $out"
echo "$out"
echo "$out" | grep -q 'is a WSL2 host: every container sees every GPU' || fail "gpus does not say WSL"
[ "$(echo "$out" | grep -cE '^[01] .* free')" = 2 ] || fail "not both GPUs listed free"
echo "$out" | grep -qE '^hello +running +astraeus-wsl +2 · shared 2 GB +0,1 ' || fail "hello is not running on both GPUs"
echo "$out" | grep -qx 'my share: 2 GB' || fail "the container did not have its share in its environment"
echo "$out" | grep -qx 'stopped hello' || fail "hello was not stopped"
echo "wsl: ok"
