#!/usr/bin/env bash
# astraeusd nodes as one GPU pool, against the real kube-apiserver and
# kube-scheduler (#64; test support only). Two nodes, each its own
# astraeusd on its own bus with its own --sim machine and its own
# astraeus-kubelet-plugin; no kubelet (scheduling needs none; the
# kubelet's prepare is covered by tests/claims.rs over the daemon's API).
#   alpha: GPU 0 8 GB with 1 GB held outside (offers 7), GPU 1 16 GB
#   beta:  GPU 0 8 GB
# Checks: each plugin publishes what its daemon offers, fullest first; the
# real scheduler binds a claim to a node and GPU that fit; a claim that
# fits nowhere stays Pending with the scheduler's reason; a local worker
# on beta shrinks beta's published capacity (republished on the daemon's
# signal) and outside use rising on alpha shrinks alpha's.
#   tests/k8s/e2e.sh       (needs scripts/k8s-build's binaries, go, cargo)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
label="k8s e2e"
# shellcheck source=setup.sh
. "$root/tests/k8s/setup.sh"
node alpha 'machine = "alpha"
[[gpu]]
model = "NVIDIA GeForce RTX 4060"
uuid = "GPU-a0000000-0000-0000-0000-000000000000"
total_gb = 8
outside_gb = 1
[[gpu]]
model = "NVIDIA RTX 4000 Ada"
uuid = "GPU-a1000000-0000-0000-0000-000000000000"
total_gb = 16'
node beta 'machine = "beta"
[[gpu]]
model = "NVIDIA GeForce RTX 4060"
uuid = "GPU-b0000000-0000-0000-0000-000000000000"
total_gb = 8'

# capacity NODE DEVICE: the memory the node's slice publishes for it.
capacity() {
  api GET "/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName=$1" | python3 -c '
import json, sys
for item in json.load(sys.stdin)["items"]:
    for d in item["spec"].get("devices", []):
        if d["name"] == sys.argv[1]:
            print(d["capacity"]["memory"]["value"])' "$2"
}
wait_capacity() { # node device value
  for _ in $(seq 60); do
    [ "$(capacity "$1" "$2")" = "$3" ] && return 0
    alive
    sleep 0.5
  done
  fail "$1's $2 does not publish $3: $(api GET "/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName=$1")"
}
wait_capacity alpha gpu-0 7Gi
wait_capacity alpha gpu-1 16Gi
wait_capacity beta gpu-0 8Gi
# Fullest first: alpha's gpu-0 (7Gi) listed before gpu-1 (16Gi).
slice=$(api GET "/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName=alpha")
[ "$(grep -o '"name":"gpu-[01]"' <<<"$slice" | head -1)" = '"name":"gpu-0"' ] || fail "alpha's devices not fullest first: $slice"
echo "$label: both nodes publish what their daemons offer (alpha 7Gi + 16Gi, beta 8Gi)" >&2


# A claim of 12Gi fits only alpha's gpu-1.
claim big 12Gi
wait_for 60 "pod big to be scheduled" bash -c '[ -n "$(node_of big)" ]'
[ "$(node_of big)" = alpha ] || fail "big went to $(node_of big)"
api GET /apis/resource.k8s.io/v1/namespaces/default/resourceclaims/big | grep -q '"device":"gpu-1"' \
  || fail "big is not on alpha's gpu-1"
# 20Gi fits nowhere: Pending, with the scheduler's reason.
claim huge 20Gi
wait_for 60 "pod huge to be found unschedulable" bash -c \
  "api GET /api/v1/namespaces/default/pods/huge | grep -q '\"reason\":\"Unschedulable\"'"
# The kubelet prepares it: booked in alpha's ledger, its CDI spec written.
prepared=$(prepare alpha big)
grep -q "astraeus.dev/claim=$(uid_of big)" <<<"$prepared" || fail "prepare big: $prepared"
grep -q "nvidia.com/gpu=GPU-a1000000-0000-0000-0000-000000000000" <<<"$prepared" || fail "prepare big: $prepared"
[ "$(worker_state alpha big)" = 's "running"' ] || fail "big's worker in alpha's ledger: $(worker_state alpha big)"
grep -q '"ASTRAEUS_GPU_MEMORY_GB=12"' "$tmp/alpha/cdi/astraeus-claim-$(uid_of big).json" || fail "big's CDI spec"
[ "$(prepare alpha big)" = "$prepared" ] || fail "a second prepare differs"
# The container runtime starts the pod's container with the claim's CDI
# device (real podman, the spec the plugin wrote, in podman 4.3's one spec
# folder): it is told its share, and the spec's createContainer hook
# (astraeusctl claim-hook) binds it to the claim in alpha's daemon.
pm=$tmp/podman
mkdir -p "$pm/rootfs/bin"
cp /bin/busybox "$pm/rootfs/bin/"
# (The limits this host lets a container have: tests/common/podman.rs.)
printf '[containers]\ndefault_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]\n[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\n' > "$pm/containers.conf"
cdi_copy=/etc/cdi/astraeus-test-e2e-$(uid_of big).json
cp "$tmp/alpha/cdi/astraeus-claim-$(uid_of big).json" "$cdi_copy"
seen=$(CONTAINERS_CONF=$pm/containers.conf podman --root "$pm/root" --runroot "$pm/runroot" --storage-driver vfs \
  run --rm --network none --device "astraeus.dev/claim=$(uid_of big)" --rootfs "$pm/rootfs" \
  /bin/busybox sh -c 'echo "share=$ASTRAEUS_GPU_MEMORY_GB"' 2>&1) || true
rm -f "$cdi_copy"
grep -qx "share=12" <<<"$seen" || fail "the pod's container with big's CDI device: $(tr "\n" " " <<<"$seen")"
grep -q "claim-$(uid_of big): a container bound" "$tmp/alpha-astraeusd.log" || fail "big's container was not bound by the hook"
echo "$label: a container started with big's CDI device was told its 12 GB and bound to the claim by the hook" >&2
echo "$label: the kubelet's prepare booked big in alpha's ledger (claim-$(uid_of big), 12 GB)" >&2
echo "$label: 12Gi bound to alpha's gpu-1; 20Gi Pending: $(api GET /api/v1/namespaces/default/pods/huge | grep -o '"message":"[^"]*"' | head -1)" >&2

# A local worker on beta takes 6.5 GB: beta republishes 1.5Gi (6 steps).
busctl --address="$bus_beta" call org.astraeus.Node1 /org/astraeus/Node1 org.astraeus.Node1.Manager \
  SubmitWorker s '{"name":"local","requested_resources":{"gpu_requests":{"shared":true,"memory_gb":6.5}}}' >/dev/null
wait_capacity beta gpu-0 1536Mi
# Outside use rising on alpha (a desktop takes 3 GB more): 4Gi left on gpu-0.
sed -i 's/outside_gb = 1/outside_gb = 4/' "$tmp/alpha/sim.toml"
kill -HUP "$daemon_alpha"
wait_capacity alpha gpu-0 4Gi
echo "$label: a local worker shrank beta's offer to 1536Mi; outside use shrank alpha's gpu-0 to 4Gi" >&2

# 3Gi: beta's 1.5Gi cannot take it, alpha's gpu-0 (4Gi) can.
claim mid 3Gi
wait_for 60 "pod mid to be scheduled" bash -c '[ -n "$(node_of mid)" ]'
[ "$(node_of mid)" = alpha ] || fail "mid went to $(node_of mid), past beta's local worker"
api GET /apis/resource.k8s.io/v1/namespaces/default/resourceclaims/mid | grep -q '"device":"gpu-0"' \
  || fail "mid is not on alpha's gpu-0"
# Before the kubelet prepares it, a local worker takes 2 GB of that GPU:
# the prepare fails with the daemon's own reason, and nothing is booked.
busctl --address="$bus_alpha" call org.astraeus.Node1 /org/astraeus/Node1 org.astraeus.Node1.Manager \
  SubmitWorker s '{"name":"race","requested_resources":{"gpu_requests":{"shared":true,"memory_gb":2,"ids":["GPU-a0000000-0000-0000-0000-000000000000"]}}}' >/dev/null
lost=$(prepare alpha mid)
grep -q "GPU 0 of alpha: 2 of 4 GB taken by shared work; it needs 3" <<<"$lost" || fail "the lost prepare said: $lost"
[ -z "$(worker_state alpha mid)" ] || fail "a claim that lost was booked"
# Once the local worker ends, the kubelet's next try succeeds.
busctl --address="$bus_alpha" call org.astraeus.Node1 /org/astraeus/Node1 org.astraeus.Node1.Manager StopWorker s race >/dev/null
grep -q "astraeus.dev/claim=" <<<"$(prepare alpha mid)" || fail "mid's prepare after the race"
echo "$label: a prepare that lost to a local worker said: ${lost#error: }; it succeeded once the worker ended" >&2
# Faults. The plugin killed between prepare and unprepare, and started
# again: the claim is still known (the daemon's ledger), and unprepares.
killed() { # PID: killed -9 on purpose, no longer checked by `alive`
  kill -9 "$1"
  wait "$1" 2>/dev/null || true
  local keep=() p
  for p in "${pids[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
  pids=("${keep[@]}")
}
killed "$plugin_alpha"
plugin alpha
wait_for 30 "alpha's plugin socket again" test -S "$tmp/alpha/plugin/dra.sock"
# alpha's daemon killed -9 and started again: the claims stay booked, and
# the plugin publishes again (it watches the daemon's name).
killed "$daemon_alpha"
sed -i 's/outside_gb = 4/outside_gb = 5/' "$tmp/alpha/sim.toml"
"$daemon_bin" --bus-address "$bus_alpha" --sim "$tmp/alpha/sim.toml" --state-dir "$tmp/alpha/state" \
  --config "$tmp/alpha/node.toml" >> "$tmp/alpha-astraeusd.log" 2>&1 &
pids+=($!)
daemon_alpha=$!
wait_for 20 "astraeusd of alpha again" busctl --address="$bus_alpha" status org.astraeus.Node1
[ "$(worker_state alpha big)" = 's "running"' ] || fail "big's worker after alpha's daemon restarted"
# gpu-0: 8 total, 5 outside: 3 offered; mid's 3 GB is the scheduler's to count.
wait_capacity alpha gpu-0 3Gi
echo "$label: the plugin and the daemon killed -9 and started again: claims kept, slices republished" >&2
# Unprepared: the worker ends, its spec goes; again: no error.
[ "$("$kubelet_call" unprepare "$tmp/alpha/plugin/dra.sock" default big "$(uid_of big)")" = unprepared ] || fail "unprepare big"
[ -z "$(worker_state alpha big)" ] || fail "big's worker after its unprepare"
[ ! -e "$tmp/alpha/cdi/astraeus-claim-$(uid_of big).json" ] || fail "big's CDI spec after its unprepare"
[ "$("$kubelet_call" unprepare "$tmp/alpha/plugin/dra.sock" default big "$(uid_of big)")" = unprepared ] || fail "unprepare big again"
# A whole GPU: none is free of shares now (beta's has a local worker,
# alpha's hold claims), so the claim waits; it never lands on a shared GPU.
claim train whole
wait_for 60 "pod train to be found unschedulable" bash -c \
  "api GET /api/v1/namespaces/default/pods/train | grep -q '\"reason\":\"Unschedulable\"'"
# big goes (its pod deleted, its claim deallocated and deleted, as the
# resource claim controller would): alpha's gpu-1 is free, train takes it
# whole, and the daemon books it whole.
delete_claim big
wait_for 60 "pod train to be scheduled" bash -c '[ -n "$(node_of train)" ]'
api GET /apis/resource.k8s.io/v1/namespaces/default/resourceclaims/train | grep -q '"device":"gpu-1-whole"' \
  || fail "train is not alpha's gpu-1 whole: $(api GET /apis/resource.k8s.io/v1/namespaces/default/resourceclaims/train)"
grep -q "astraeus.dev/claim=" <<<"$(prepare alpha train)" || fail "train's prepare"
[ "$(worker_state alpha train)" = 's "running"' ] || fail "train's worker"
grep -q '"ASTRAEUS_GPU_MEMORY_GB=16"' "$tmp/alpha/cdi/astraeus-claim-$(uid_of train).json" || fail "train's CDI spec: the GPU whole"
# The reverse: a share never lands on the GPU held whole.
claim small 1Gi
wait_for 60 "pod small to be scheduled" bash -c '[ -n "$(node_of small)" ]'
[ "$(node_of small)" = beta ] || fail "small went to $(node_of small): $(api GET /apis/resource.k8s.io/v1/namespaces/default/resourceclaims/small)"
echo "$label: a whole claim waited while every GPU was shared, then took alpha's gpu-1 whole; the next share went to beta" >&2

# A claim deleted while prepared (its kubelet's unprepare lost): the
# plugin unprepares it against the API server's list.
grep -q "astraeus.dev/claim=" <<<"$(prepare beta small)" || fail "small's prepare"
[ "$(worker_state beta small)" = 's "running"' ] || fail "small's worker"
small_uid=$(uid_of small)
delete_claim small
export bus_beta small_uid
wait_for 30 "small's worker to be unprepared by the plugin" bash -c \
  "! busctl --address=\"\$bus_beta\" get-property org.astraeus.Node1 /org/astraeus/Node1/worker/claim_2d\$(sed 's/-/_2d/g' <<<\"\$small_uid\") org.astraeus.Node1.Worker State"
[ ! -e "$tmp/beta/cdi/astraeus-claim-$small_uid.json" ] || fail "small's CDI spec after its cleanup"
echo "$label: a claim deleted while prepared was unprepared against the API server" >&2
# The API server gone for a while: beta's local worker ends meanwhile (its
# plugin cannot publish); once the server is back, beta's whole 8 GB is
# published again, and no plugin gave up.
killed "$api_pid"
busctl --address="$bus_beta" call org.astraeus.Node1 /org/astraeus/Node1 org.astraeus.Node1.Manager StopWorker s local >/dev/null
sleep 3
start_apiserver
wait_capacity beta gpu-0 8Gi
echo "$label: the API server away for a while: slices published again once it was back" >&2
# docs/kubernetes.md's walk-through, its lines as a person types them: its
# kubectl lines (the packaged manifests read from packaging/kubernetes/;
# `kubectl logs` left out: no kubelet runs the pod here), its listen.yaml,
# then the kubelet's prepare on the node the pod went to, and its
# astraeusctl lines there.
python3 - "$root/docs/kubernetes.md" "$tmp" <<'PY' || fail "the walk-through's lines could not be read from docs/kubernetes.md"
import re, sys
doc = open(sys.argv[1]).read()
walk = doc.split("## Walk-through", 1)[1].split("\n## ", 1)[0]
yaml = [b for b in re.findall(r"```yaml\n(.*?)```", walk, re.S) if b.startswith("# docs/kubernetes.md walk-through: listen.yaml")]
assert len(yaml) == 1, "no listen.yaml block"
open(sys.argv[2] + "/listen.yaml", "w").write(yaml[0])
lines = [l for b in re.findall(r"```sh\n(.*?)```", walk, re.S) for l in b.splitlines() if l and not l.startswith("#")]
open(sys.argv[2] + "/walk-kubectl", "w").write("".join(l + "\n" for l in lines if l.startswith("kubectl ") and not l.startswith("kubectl logs")))
# The node's lines once the pod is there (the first, `astraeusctl gpus`, is the install's check).
after = lines[next(i for i, l in enumerate(lines) if l == "kubectl apply -f listen.yaml"):]
open(sys.argv[2] + "/walk-astraeusctl", "w").write("".join(l + "\n" for l in after if l.startswith("astraeusctl ")))
PY
[ "$(wc -l < "$tmp/walk-kubectl")" -ge 6 ] || fail "the walk-through has fewer kubectl lines than it had: $(cat "$tmp/walk-kubectl")"
while read -r line; do
  line=${line//\/usr\/share\/astraeus-kubelet-plugin\//$root/packaging/kubernetes/}
  eval "$line" > "$tmp/walk.out" 2>&1 || fail "walk-through: \`$line\` failed: $(cat "$tmp/walk.out")"
done < "$tmp/walk-kubectl"
grep -q '^listen ' <<<"$(kubectl get resourceslices 2>/dev/null; kubectl get resourceclaims)" || fail "no claim listen after the walk-through"
wait_for 60 "pod listen to be scheduled" bash -c '[ -n "$(node_of listen)" ]'
at=$(node_of listen)
claim_json=$(api GET /apis/resource.k8s.io/v1/namespaces/default/resourceclaims/listen)
grep -q '"consumedCapacity":{"memory":"2Gi"}' <<<"$claim_json" || fail "listen is not 2Gi of a shared GPU: $claim_json"
grep -q "astraeus.dev/claim=" <<<"$(prepare "$at" listen)" || fail "listen's prepare on $at"
bus_var="bus_$at"
astraeusctl() { "$root/target/debug/astraeusctl" --bus-address "${!bus_var}" "$@"; }
while read -r line; do
  eval "$line" > "$tmp/walk.out" 2>&1 || fail "walk-through: \`$line\` on $at failed: $(cat "$tmp/walk.out")"
  grep -q "claim-$(uid_of listen)" "$tmp/walk.out" || fail "walk-through: \`$line\` does not show listen's claim: $(cat "$tmp/walk.out")"
done < "$tmp/walk-astraeusctl"
[ "$(wc -l < "$tmp/walk-astraeusctl")" -ge 2 ] || fail "the walk-through has fewer astraeusctl lines than it had"
echo "$label: docs/kubernetes.md's walk-through: listen (2Gi) bound to $at, prepared, shown by astraeusctl there" >&2
# A GPU that turns unhealthy is published tainted with why (device taints,
# GA in 1.37), its capacity gone: the next claim waits rather than land
# there, and takes it once it is healthy again.
sed -i 's/^total_gb = 8$/total_gb = 8\nhealthy = false/' "$tmp/beta/sim.toml"
kill -HUP "$daemon_beta"
taint_of() { # node device: its taints' keys and effects
  api GET "/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName=$1" | python3 -c '
import json, sys
for item in json.load(sys.stdin)["items"]:
    for d in item["spec"].get("devices", []):
        if d["name"] == sys.argv[1]:
            print(" ".join(t["key"] + ":" + t["effect"] for t in d.get("taints", [])))' "$2"
}
export -f taint_of
wait_for 30 "beta's gpu-0 tainted unhealthy" bash -c '[ "$(taint_of beta gpu-0)" = "gpu.astraeus.dev/unhealthy:NoSchedule" ]'
[ -z "$(capacity beta gpu-0)" ] || fail "beta's unhealthy gpu-0 still publishes capacity"
claim late 1Gi
wait_for 60 "pod late to be found unschedulable" bash -c \
  "api GET /api/v1/namespaces/default/pods/late | grep -q '\"reason\":\"Unschedulable\"'"
sed -i '/^healthy = false$/d' "$tmp/beta/sim.toml"
kill -HUP "$daemon_beta"
wait_for 60 "pod late to be scheduled" bash -c '[ -n "$(node_of late)" ]'
[ "$(node_of late)" = beta ] || fail "late went to $(node_of late)"
[ -z "$(taint_of beta gpu-0)" ] || fail "beta's gpu-0 still tainted once healthy"
echo "$label: beta's GPU unhealthy: published tainted gpu.astraeus.dev/unhealthy, the next claim waited; healthy again, it went there" >&2

# A node with a GPU in MIG mode (its astraeusd reads NVML: the fake): each
# instance is published whole (mig-N), the GPU not at all; a claim of the
# MIG class takes one, booked whole on that instance and told its memory;
# the instance taken is no longer published.
node_nvml gamma "gpu uuid=GPU-c0000000-0000-0000-0000-000000000000 name=NVIDIA_A100 total=$((80 << 30)) used=0 reserved=0 bus=00000000:01:00.0 power=60000 energy=1000 util=3 mig=1,1
mig gpu=0 uuid=MIG-c1000000-0000-0000-0000-000000000000 name=NVIDIA_A100_MIG_3g.40gb total=$((40 << 30)) used=0
mig gpu=0 uuid=MIG-c2000000-0000-0000-0000-000000000000 name=NVIDIA_A100_MIG_3g.40gb total=$((40 << 30)) used=0"
wait_capacity gamma mig-1 40Gi
wait_capacity gamma mig-2 40Gi
[ -z "$(capacity gamma gpu-0)" ] || fail "gamma's GPU in MIG mode is published"
# Its devices say the driver NVML reads (the fake's), beside UUID, model, index.
api GET "/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName=gamma" \
  | grep -q '"driver":{"string":"999.99-fake"}' || fail "gamma's devices do not say the driver"
claim inst mig
wait_for 60 "pod inst to be scheduled" bash -c '[ -n "$(node_of inst)" ]'
[ "$(node_of inst)" = gamma ] || fail "inst went to $(node_of inst)"
inst_dev=$(api GET /apis/resource.k8s.io/v1/namespaces/default/resourceclaims/inst | grep -o '"device":"mig-[12]"' | cut -d'"' -f4)
[ -n "$inst_dev" ] || fail "inst is not a MIG instance: $(api GET /apis/resource.k8s.io/v1/namespaces/default/resourceclaims/inst)"
grep -q "astraeus.dev/claim=" <<<"$(prepare gamma inst)" || fail "inst's prepare"
[ "$(worker_state gamma inst)" = 's "running"' ] || fail "inst's worker on gamma"
grep -q '"ASTRAEUS_GPU_MEMORY_GB=40"' "$tmp/gamma/cdi/astraeus-claim-$(uid_of inst).json" || fail "inst's CDI spec: the instance's 40 GB"
for _ in $(seq 60); do [ -z "$(capacity gamma "$inst_dev")" ] && break; sleep 0.5; done
[ -z "$(capacity gamma "$inst_dev")" ] || fail "gamma still publishes $inst_dev, taken"
echo "$label: a MIG claim took gamma's $inst_dev whole (40 GB), no longer published; the GPU in MIG mode never was" >&2
echo "$label: OK" >&2
