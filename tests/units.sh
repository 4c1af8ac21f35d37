#!/usr/bin/env bash
# Unit workers against a real systemd user manager, in a private mount
# namespace (recipe in shared/test-environment.md). Run by tests/units.rs as:
#   unshare --mount --propagation private bash tests/units.sh ASTRAEUSD ASTRAEUSCTL SIM_FILE FAKE_NVML FAKE_NVML_OLD
# User= cannot be tested in a user manager (it is root's own); it is set only
# for non-root owners: tests/system_manager.sh runs a member's unit under a
# real system manager.
set -euo pipefail
daemon=$1 ctl=$2 sim=$3 fake_nvml=$4 fake_nvml_old=$5
rt=$(mktemp -d /var/lib/astraeus-units.XXXXXX)
mkdir -p "$rt/run-systemd/system" "$rt/state"
mount --bind "$rt/run-systemd" /run/systemd
export XDG_RUNTIME_DIR=$rt DBUS_SESSION_BUS_ADDRESS=unix:path=$rt/bus
dbus-daemon --session --address="$DBUS_SESSION_BUS_ADDRESS" --fork --print-pid=1 > "$rt/dbus.pid"
/lib/systemd/systemd --user > "$rt/manager.log" 2>&1 &
manager=$!
daemon_pid=
cleanup() {
    [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null
    kill "$manager" "$(cat "$rt/dbus.pid")" 2>/dev/null || true
    umount /run/systemd 2>/dev/null || true
    rm -rf "$rt"
}
trap cleanup EXIT
for _ in $(seq 300); do systemctl --user is-system-running >/dev/null 2>&1 && break; sleep 0.1; done
cp "$sim" "$rt/majin.toml"
printf '[runtime]\nstop_timeout_seconds = 2\n' > "$rt/node.toml"
# The daemon with these arguments (after --session), once it answers.
start_with() {
    "$daemon" --session "$@" 2>>"$rt/daemon.log" &
    daemon_pid=$!
    for _ in $(seq 300); do busctl --user status org.astraeus.Node1 >/dev/null 2>&1 && return; sleep 0.1; done
    cat "$rt/daemon.log"; exit 1
}
start_daemon() { start_with --sim "$rt/majin.toml" --state-dir "$rt/state" --config "$rt/node.toml"; }
state() { busctl --user get-property org.astraeus.Node1 "/org/astraeus/Node1/worker/$1" org.astraeus.Node1.Worker State 2>/dev/null || echo gone; }
wait_for() { for _ in $(seq 300); do [ "$(state "$1")" = "$2" ] && return; sleep 0.1; done; echo "worker $1: wanted $2, is $(state "$1")"; cat "$rt/daemon.log"; exit 1; }
fail() { echo "FAIL: $*"; cat "$rt/daemon.log"; exit 1; }
start_daemon

echo "== a unit gets its environment and limits, and its exit frees the share"
cat > "$rt/job.json" <<JSON
{"name":"job","requested_resources":{"cpu_cores":0.5,"memory_bytes":268435456,
 "gpu_requests":{"shared":true,"memory_gb":2.5}},
 "run":{"unit":{"exec":["/bin/sh","-c","echo GB=\$ASTRAEUS_GPU_MEMORY_GB CUDA=\$CUDA_VISIBLE_DEVICES NVIDIA=\$NVIDIA_VISIBLE_DEVICES K=\$K > $rt/out.txt; sleep 3; exit 4"],"env":{"K":"V"}}}}
JSON
"$ctl" --session submit "$rt/job.json"
wait_for job 's "running"'
for _ in $(seq 300); do [ -s "$rt/out.txt" ] && break; sleep 0.1; done
grep -qx "GB=2.5 CUDA=GPU-5c0a7d3e-4060-4b1e-9f00-000000000000 NVIDIA=GPU-5c0a7d3e-4060-4b1e-9f00-000000000000 K=V" "$rt/out.txt" || fail "environment: $(cat "$rt/out.txt")"
[ "$(systemctl --user show astraeus-worker-job.service -p MemoryMax --value)" = 268435456 ] || fail "MemoryMax"
[ "$(systemctl --user show astraeus-worker-job.service -p CPUQuotaPerSecUSec --value)" = 500ms ] || fail "CPUQuota"
[ "$(systemctl --user show astraeus-worker-job.service -p NoNewPrivileges --value)" = yes ] || fail "NoNewPrivileges"
e=$(busctl --user get-property org.astraeus.Node1 /org/astraeus/Node1/worker/job org.astraeus.Node1.Worker Enforcement)
[ "$e" = 's "promised: GPU 0: simulated GPU"' ] || fail "Enforcement on --sim: $e"
wait_for job gone
grep -q "worker job exited with status 4" "$rt/daemon.log" || fail "exit status not recorded"
taken=$(busctl --user get-property org.astraeus.Node1 /org/astraeus/Node1/gpu/0 org.astraeus.Node1.Gpu TakenGb)
[ "$taken" = "d 0" ] || fail "share not freed: $taken"

echo "== StopWorker stops the unit"
printf '{"name":"svc","run":{"unit":{"exec":["/bin/sleep","1000"]}}}' | "$ctl" --session submit -
wait_for svc 's "running"'
"$ctl" --session stop svc
wait_for svc gone
[ "$(systemctl --user show astraeus-worker-svc.service -p ActiveState --value)" != active ] || fail "unit still active"

echo "== a unit that cannot start ends the worker with the reason, and frees its share"
# (astraeusctl submit waits for the launch: it may say how it failed, exit 1.)
printf '{"name":"bad","requested_resources":{"gpu_requests":{"shared":true,"memory_gb":1}},"run":{"unit":{"exec":["/nonexistent/server"]}}}' | "$ctl" --session submit - || true
wait_for bad gone
grep -E "worker bad (exited with status|failed)" "$rt/daemon.log" || fail "no reason recorded for bad"
taken=$(busctl --user get-property org.astraeus.Node1 /org/astraeus/Node1/gpu/0 org.astraeus.Node1.Gpu TakenGb)
[ "$taken" = "d 0" ] || fail "share of bad not freed: $taken"

echo "== kill -9 of the daemon: the running unit is adopted, not started twice"
printf '{"name":"keep","run":{"unit":{"exec":["/bin/sleep","1000"]}}}' | "$ctl" --session submit -
wait_for keep 's "running"'
pid_before=$(systemctl --user show astraeus-worker-keep.service -p MainPID --value)
kill -9 "$daemon_pid"; wait "$daemon_pid" 2>/dev/null || true
start_daemon
wait_for keep 's "running"'
grep -q "adopted the running workload of worker keep" "$rt/daemon.log" || fail "not adopted"
[ "$(systemctl --user show astraeus-worker-keep.service -p MainPID --value)" = "$pid_before" ] || fail "started twice"
"$ctl" --session stop keep
wait_for keep gone

echo "== the bus daemon restarted: the daemon stops, records no running unit as ended, and adopts it when started again"
printf '{"name":"stay","run":{"unit":{"exec":["/bin/sleep","1000"]}}}' | "$ctl" --session submit -
wait_for stay 's "running"'
pid_before=$(systemctl --user show astraeus-worker-stay.service -p MainPID --value)
# The bus daemon the daemon talks to (the user manager's socket-activated one).
bus_pid=$(busctl --user call org.freedesktop.DBus /org/freedesktop/DBus org.freedesktop.DBus GetConnectionUnixProcessID s org.freedesktop.DBus | cut -d' ' -f2)
kill "$bus_pid"
for _ in $(seq 150); do kill -0 "$daemon_pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$daemon_pid" 2>/dev/null; then fail "the daemon outlived its bus"; fi
status=0; wait "$daemon_pid" || status=$?
daemon_pid=
[ "$status" = 1 ] || fail "exit status $status after the bus went"
grep -q "the bus connection closed" "$rt/daemon.log" || fail "no reason given for stopping"
if grep -E "worker stay (exited|failed|ended)" "$rt/daemon.log"; then fail "stay recorded as ended"; fi
start_daemon
wait_for stay 's "running"'
grep -q "adopted the running workload of worker stay" "$rt/daemon.log" || fail "stay not adopted"
[ "$(systemctl --user show astraeus-worker-stay.service -p MainPID --value)" = "$pid_before" ] || fail "stay started twice"
echo "== a shared unit's GPU memory limits are on its own slice before its first line (NVML r615, the fake library)"
kill "$daemon_pid"; wait "$daemon_pid" 2>/dev/null || true
uuid=GPU-5c0a7d3e-4060-4b1e-9f00-000000000000
printf 'gpu uuid=%s name=NVIDIA_L4 total=%s used=0 reserved=0 bus=00000000:01:00.0 power=60000 energy=1000 util=3\n' \
    "$uuid" $((24 << 30)) > "$rt/gpus.txt"
printf 'machine = "majin"\n[inventory]\nrefresh_seconds = 0.5\nwsl = false\nnvml_library = "%s"\n[runtime]\nstop_timeout_seconds = 2\n' \
    "$fake_nvml" > "$rt/nvml.toml"
export FAKE_NVML_FIXTURE=$rt/gpus.txt FAKE_NVML_LIMITS=$rt/limits.txt
mkdir -p "$rt/state-nvml"
start_nvml_daemon() { start_with --state-dir "$rt/state-nvml" --config "$rt/nvml.toml"; }
enforcement() { busctl --user get-property org.astraeus.Node1 "/org/astraeus/Node1/worker/$1" org.astraeus.Node1.Worker Enforcement 2>/dev/null; }
start_nvml_daemon
# Its first line: the limits line the driver holds for its own group's
# slice, in the hierarchy that accounts memory: the memory controller's on
# a v1 or hybrid host (these machines), the unified one on a cgroup v2 host
# (Debian 12's default). Both the test and its unit read which from
# /proc/self/cgroup, as the daemon does.
cgroup_layout='if grep -qE "^[0-9]+:([^:]*,)?memory(,[^:]*)?:" /proc/self/cgroup; then
  cg=$(awk -F: '"'"'$2 ~ /(^|,)memory(,|$)/ {print $3}'"'"' /proc/self/cgroup); mem_root=/sys/fs/cgroup/memory
else
  cg=$(awk -F: '"'"'$1 == "0" {print $3}'"'"' /proc/self/cgroup); mem_root=/sys/fs/cgroup
fi'
eval "$cgroup_layout"
cat > "$rt/first-line.sh" <<SH
#!/bin/sh
$cgroup_layout
grep -F " \$mem_root\$(dirname \$cg)" $rt/limits.txt > $rt/seen.txt
echo \$cg > $rt/cg.txt
exec sleep 1000
SH
cat > "$rt/held.json" <<JSON
{"name":"heldjob","requested_resources":{"gpu_requests":{"shared":true,"memory_gb":2.5}},
 "run":{"unit":{"exec":["/bin/sh","$rt/first-line.sh"]}}}
JSON
"$ctl" --session submit "$rt/held.json"
wait_for heldjob 's "running"'
for _ in $(seq 300); do [ -s "$rt/cg.txt" ] && break; sleep 0.1; done
cg=$(cat "$rt/cg.txt")
slice=$(systemctl --user show 'astraeus-worker-heldjob.slice' -p ControlGroup --value)
[ "$(dirname "$cg")" = "$slice" ] || fail "the unit ($cg) is not in its own slice ($slice)"
[ "$(cat "$rt/seen.txt")" = "$uuid 2684354560 2684354560 $mem_root$slice" ] \
    || fail "its first line saw no limit on its slice: '$(cat "$rt/seen.txt")' in $(cat "$rt/limits.txt")"
[ "$(enforcement heldjob)" = 's "held"' ] || fail "Enforcement: $(enforcement heldjob)"
"$ctl" --session workers | grep -E '^heldjob +running .* held ' >/dev/null || fail "workers: $("$ctl" --session workers)"

echo "== limits lost (a GPU reset) and the daemon killed: set again on its slice when it is adopted"
kill -9 "$daemon_pid"; wait "$daemon_pid" 2>/dev/null || true
: > "$rt/limits.txt"
start_nvml_daemon
wait_for heldjob 's "running"'
for _ in $(seq 300); do grep -q "$mem_root$slice\$" "$rt/limits.txt" && break; sleep 0.1; done
grep -qx "$uuid 2684354560 2684354560 $mem_root$slice" "$rt/limits.txt" || fail "not set again: $(cat "$rt/limits.txt")"
for _ in $(seq 300); do [ "$(enforcement heldjob)" = 's "held"' ] && break; sleep 0.1; done
[ "$(enforcement heldjob)" = 's "held"' ] || fail "Enforcement after the restart: $(enforcement heldjob)"

echo "== stopped: its slice is gone, and its limits with it"
"$ctl" --session stop heldjob
wait_for heldjob gone
for _ in $(seq 300); do [ "$(systemctl --user show 'astraeus-worker-heldjob.slice' -p ActiveState --value)" != active ] && break; sleep 0.1; done
[ "$(systemctl --user show 'astraeus-worker-heldjob.slice' -p ActiveState --value)" != active ] || fail "its slice outlived it"
while read -r _ _ _ d; do [ -d "$d" ] && fail "a limit left on $d"; done < "$rt/limits.txt"
echo "== dmem: a driver without NVML's calls, a kernel whose dmem controller lists the GPU (a tree laid out here, as 6.14 would)"
kill "$daemon_pid"; wait "$daemon_pid" 2>/dev/null || true
group=$rt/dmem/astraeus.slice/astraeus-worker.slice/astraeus-worker-dmjob.slice
region=nvidia/0000:01:00.0/vidmem
mkdir -p "$group"
printf '%s %s\n' "$region" $((24 << 30)) > "$rt/dmem/dmem.capacity"
printf '%s 0\n' "$region" > "$group/dmem.min"
printf '%s max\n' "$region" > "$group/dmem.max"
printf 'machine = "majin"\n[inventory]\nrefresh_seconds = 0.5\nwsl = false\nnvml_library = "%s"\n[runtime]\nstop_timeout_seconds = 2\n[sharing]\ncgroup_root = "%s"\n' \
    "$fake_nvml_old" "$rt/dmem" > "$rt/nvml.toml"
start_nvml_daemon
gpu_limits=$(busctl --user get-property org.astraeus.Node1 /org/astraeus/Node1/gpu/0 org.astraeus.Node1.Gpu ShareLimits)
# (busctl writes the apostrophe of "kernel's" escaped.)
echo "$gpu_limits" | grep -q '^s "held: by the kernel.*s dmem controller"$' || fail "ShareLimits: $gpu_limits"
cat > "$rt/dm.json" <<JSON
{"name":"dmjob","requested_resources":{"gpu_requests":{"shared":true,"memory_gb":2.5}},
 "run":{"unit":{"exec":["/bin/sh","-c","cat $group/dmem.min $group/dmem.max > $rt/dm-seen.txt; exec sleep 1000"]}}}
JSON
"$ctl" --session submit "$rt/dm.json"
wait_for dmjob 's "running"'
for _ in $(seq 300); do [ -s "$rt/dm-seen.txt" ] && break; sleep 0.1; done
[ "$(cat "$rt/dm-seen.txt")" = "$(printf '%s 2684354560\n%s 2684354560' "$region" "$region")" ] \
    || fail "its first line saw: $(cat "$rt/dm-seen.txt")"
[ "$(enforcement dmjob)" = 's "held"' ] || fail "Enforcement with dmem: $(enforcement dmjob)"
"$ctl" --session stop dmjob
wait_for dmjob gone
for _ in $(seq 300); do grep -qx "$region max" "$group/dmem.max" 2>/dev/null && break; sleep 0.1; done
grep -qx "$region max" "$group/dmem.max" || fail "dmem.max not cleared: $(cat "$group/dmem.max")"
grep -qx "$region 0" "$group/dmem.min" || fail "dmem.min not cleared: $(cat "$group/dmem.min")"
echo "units: OK"
