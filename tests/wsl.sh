#!/usr/bin/env bash
# WSL as the daemon sees it (#51, item 6), in a private mount namespace:
#   unshare --mount --propagation private bash tests/wsl.sh ASTRAEUSD ASTRAEUSCTL NVML_LIB FIXTURE
# - /dev has WSL's GPU device /dev/dxg (beside the usual null, zero, …),
# - WSL's NVML is where WSL puts it, /usr/lib/wsl/lib/libnvidia-ml.so.1
#   (an overlay on /usr/lib adds it), and lists no processes;
# - the daemon, with no configuration of either, finds both: says it is a
#   WSL2 host, loads that NVML, and a shared worker takes its memory on
#   every GPU.
set -euo pipefail
daemon=$1 ctl=$2 lib=$3 fixture=$4
rt=$(mktemp -d /var/tmp/astraeus-wsl.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do while kill -0 "$p" 2>/dev/null; do sleep 0.05; done; done
    umount -l /usr/lib 2>/dev/null || true
    umount -lR /dev 2>/dev/null || true
    for d in null zero full random urandom; do umount -l "$rt/dev/$d" 2>/dev/null || true; done
    rm -rf "$rt" || true
}
trap cleanup EXIT
fail() {
    echo "FAIL: $*"
    tail -20 "$rt/daemon.log"
    exit 1
}
# WSL's /dev: its GPU device, and what every program needs.
mkdir "$rt/dev"
for d in null zero full random urandom; do
    touch "$rt/dev/$d"
    mount --bind "/dev/$d" "$rt/dev/$d"
done
touch "$rt/dev/dxg"
mount --rbind "$rt/dev" /dev
# WSL's NVML, where WSL mounts it; nothing says where.
mkdir -p "$rt/lower/wsl/lib" "$rt/state"
cp "$lib" "$rt/lower/wsl/lib/libnvidia-ml.so.1"
mount -t overlay overlay -o "lowerdir=$rt/lower:/usr/lib" /usr/lib
[ -e /dev/dxg ] && [ -f /usr/lib/wsl/lib/libnvidia-ml.so.1 ] || fail "the WSL layout is not in place"
printf '[inventory]\nrefresh_seconds = 0.2\n' > "$rt/node.toml"
cp "$fixture" "$rt/gpus.txt"
address=$(dbus-daemon --session --fork --print-address=1 --print-pid=3 3> "$rt/bus.pid")
pids+=("$(cat "$rt/bus.pid")")
FAKE_NVML_FIXTURE=$rt/gpus.txt ASTRAEUS_GPU_LOCK_DIR=$rt "$daemon" --bus-address "$address" \
    --state-dir "$rt/state" --config "$rt/node.toml" 2> "$rt/daemon.log" &
pids+=("$!")
for _ in $(seq 200); do
    busctl --address="$address" status org.astraeus.Node1 >/dev/null 2>&1 && break
    sleep 0.1
done
grep -q 'NVML loaded from /usr/lib/wsl/lib/libnvidia-ml.so.1' "$rt/daemon.log" || fail "WSL's NVML was not the one loaded"
[ "$(busctl --address="$address" get-property org.astraeus.Node1 /org/astraeus/Node1 \
    org.astraeus.Node1.Manager Wsl)" = "b true" ] || fail "not seen as WSL"
busctl --address="$address" call org.astraeus.Node1 /org/astraeus/Node1 org.astraeus.Node1.Manager \
    SubmitWorker s '{"name":"voice","requested_resources":{"gpu_requests":{"shared":true,"memory_gb":2}}}' > /dev/null
gpus=$(busctl --address="$address" get-property org.astraeus.Node1 /org/astraeus/Node1/worker/voice \
    org.astraeus.Node1.Worker Gpus)
[ "$gpus" = 'a(us) 2 0 "GPU-wsl-0" 1 "GPU-wsl-1"' ] || fail "the shared worker holds $gpus"
listing=$("$ctl" --bus-address "$address" gpus)
echo "$listing"
echo "$listing" | head -1 | grep -q 'is a WSL2 host: every container sees every GPU' || fail "gpus does not say WSL"
[ "$(echo "$listing" | grep -cE ' shared +2 GB')" = 2 ] || fail "not both GPUs shared"
echo "wsl: ok"
