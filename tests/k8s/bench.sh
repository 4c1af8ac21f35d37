#!/usr/bin/env bash
# What a pod's claim costs (#64; a measurement, not a test: nothing is
# asserted of time): 50 pods, one after another, each with a claim of
# 1Gi, on two nodes (alpha: two 80 GB GPUs, beta: one), against the real
# kube-apiserver and kube-scheduler. For each: created → allocated by the
# scheduler (polled every 20 ms), and created → prepared on its node (the
# kubelet's NodePrepareResources through the plugin into the daemon's
# ledger). Prints p50 and p99 of each, and their ratio (docs/benchmarks.md).
# Then slice updates under churn: CHANGES times a local worker of 8 GB is
# submitted on beta and stopped again, while claims are prepared and
# unprepared on alpha meanwhile; for each change, the daemon's answer →
# beta's slice in the API server saying the new capacity (polled every
# 20 ms): p50 and p99, beside the same run's scheduling time.
#   tests/k8s/bench.sh [PODS] [CHANGES]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
pods=${1:-50}
changes=${2:-40}
label="k8s bench"
# shellcheck source=setup.sh
. "$root/tests/k8s/setup.sh"
gpu() { printf '[[gpu]]\nmodel = "NVIDIA H100"\nuuid = "GPU-%s"\ntotal_gb = 80\n' "$1"; }
node alpha "machine = \"alpha\"
$(gpu a0000000-0000-0000-0000-000000000000)
$(gpu a1000000-0000-0000-0000-000000000000)"
node beta "machine = \"beta\"
$(gpu b0000000-0000-0000-0000-000000000000)"
api POST /api/v1/namespaces/default/serviceaccounts '{"metadata":{"name":"default"}}' >/dev/null 2>&1 || true
wait_for 30 "both nodes' slices" bash -c \
  "[ \$(api GET /apis/resource.k8s.io/v1/resourceslices | grep -o '\"name\":\"gpu-[0-9]\"' | wc -l) -ge 3 ]"
ms() { echo $(( $(date +%s%N) / 1000000 )); }
: > "$tmp/times"
for i in $(seq "$pods"); do
  t0=$(ms)
  claim "p$i" 1Gi
  until api GET "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/p$i" | grep -q '"allocation"'; do
    sleep 0.02
  done
  t1=$(ms)
  n=$(node_of "p$i")
  while [ -z "$n" ]; do sleep 0.02; n=$(node_of "p$i"); done
  grep -q "astraeus.dev/claim=" <<<"$(prepare "$n" "p$i")" || fail "p$i's prepare on $n"
  t2=$(ms)
  echo "$((t1 - t0)) $((t2 - t0)) $n" >> "$tmp/times"
done
# Slice updates under churn.
capacity() { # node device: the memory its slice publishes
  api GET "/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName=$1" | python3 -c '
import json, sys
for item in json.load(sys.stdin)["items"]:
    for d in item["spec"].get("devices", []):
        if d["name"] == sys.argv[1]:
            print(d.get("capacity", {}).get("memory", {}).get("value", ""))' "$2"
}
start=$(capacity beta gpu-0)
churn() { # prepares and unprepares claims on alpha, meanwhile
  local k=0
  while :; do
    k=$((k + 1))
    "$kubelet_call" prepare "$tmp/alpha/plugin/dra.sock" default "p1" "$(uid_of p1)" >/dev/null 2>&1 || true
    busctl --address="$bus_alpha" call org.astraeus.Node1 /org/astraeus/Node1 org.astraeus.Node1.Manager \
      SubmitWorker s "{\"name\":\"c$k\",\"requested_resources\":{\"gpu_requests\":{\"shared\":true,\"memory_gb\":1}}}" >/dev/null 2>&1 || true
    busctl --address="$bus_alpha" call org.astraeus.Node1 /org/astraeus/Node1 org.astraeus.Node1.Manager StopWorker s "c$k" >/dev/null 2>&1 || true
  done
}
churn 2>/dev/null &
churn_pid=$!
: > "$tmp/slices"
for i in $(seq "$changes"); do
  t0=$(ms)
  busctl --address="$bus_beta" call org.astraeus.Node1 /org/astraeus/Node1 org.astraeus.Node1.Manager \
    SubmitWorker s '{"name":"local","requested_resources":{"gpu_requests":{"shared":true,"memory_gb":8}}}' >/dev/null
  t1=$(ms)
  while [ "$(capacity beta gpu-0)" = "$start" ]; do sleep 0.02; done
  t2=$(ms)
  busctl --address="$bus_beta" call org.astraeus.Node1 /org/astraeus/Node1 org.astraeus.Node1.Manager StopWorker s local >/dev/null
  t3=$(ms)
  while [ "$(capacity beta gpu-0)" != "$start" ]; do sleep 0.02; done
  t4=$(ms)
  echo "$((t2 - t1)) $((t4 - t3))" >> "$tmp/slices"
  [ $((t1 - t0)) -ge 0 ]
done
kill "$churn_pid" 2>/dev/null || true
wait "$churn_pid" 2>/dev/null || true
python3 - "$tmp/slices" <<'PY'
import sys
xs = sorted(int(v) for l in open(sys.argv[1]) for v in l.split())
def pct(p):
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]
print(f"slice updates under churn: {len(xs)} changes, daemon's answer -> slice in the API server: p50 {pct(50)} ms, p99 {pct(99)} ms")
PY
python3 - "$tmp/times" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1])]
def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]
sched = [int(r[0]) for r in rows]
prep = [int(r[1]) for r in rows]
nodes = {n: sum(1 for r in rows if r[2] == n) for n in {r[2] for r in rows}}
print(f"pods {len(rows)} on {nodes}")
print(f"created -> allocated: p50 {pct(sched, 50)} ms, p99 {pct(sched, 99)} ms")
print(f"created -> prepared:  p50 {pct(prep, 50)} ms, p99 {pct(prep, 99)} ms")
print(f"prepared / allocated: p50 {pct(prep, 50) / pct(sched, 50):.2f}x, p99 {pct(prep, 99) / pct(sched, 99):.2f}x")
PY
