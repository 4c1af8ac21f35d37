# Test support only: astraeusd nodes for the Kubernetes tests, sourced
# after cluster.sh by tests/k8s/e2e.sh and tests/k8s/bench.sh (which set
# $daemon_bin, $plugin_bin and $kubelet_call): the device classes, a
# node (its bus, daemon, Node object and plugin), claims with their pods,
# and the kubelet's prepare.
# The shipped manifests (packaging/kubernetes/), applied with kubectl as a
# person would: the device classes (a share of a GPU, and a GPU whole: each
# GPU is both devices, kept apart by a counter set: docs/kubernetes.md),
# and the plugin's RBAC. The plugins run as its service account (a token
# from the TokenRequest API), so the RBAC is what lets them publish, read
# claims and clean up. The DaemonSet is checked by the API server
# (--dry-run=server: there is no kubelet here to run it).
kubectl() { "$out/kubectl" --kubeconfig "$tmp/kubeconfig" "$@"; }
for m in deviceclasses rbac; do
  kubectl apply -f "$root/packaging/kubernetes/$m.yaml" >/dev/null || fail "kubectl apply $m.yaml"
done
kubectl apply --dry-run=server -f "$root/packaging/kubernetes/daemonset.yaml" >/dev/null \
  || fail "the API server refuses packaging/kubernetes/daemonset.yaml"
plugin_token=$(kubectl -n astraeus create token astraeus-kubelet-plugin --duration 2h) \
  || fail "no token for the plugin's service account"
sed "s|token: \"$token\"|token: \"$plugin_token\"|" "$tmp/kubeconfig" > "$tmp/plugin.kubeconfig"

# node NAME SIM_TOML: its bus, its daemon, its Node and its plugin.
node() {
  local n=$1 bus
  mkdir -p "$tmp/$n/plugin" "$tmp/$n/reg" "$tmp/$n/cdi"
  printf '%s\n' "$2" > "$tmp/$n/sim.toml"
  printf '[inventory]\nrefresh_seconds = 0.5\n' > "$tmp/$n/node.toml"
  read -r bus dbus_pid < <(dbus-daemon --session --print-address=1 --print-pid=1 --fork | paste -sd' ')
  pids+=("$dbus_pid")
  eval "bus_$n=\$bus"
  "$daemon_bin" --bus-address "$bus" --sim "$tmp/$n/sim.toml" --state-dir "$tmp/$n/state" \
    --config "$tmp/$n/node.toml" > "$tmp/$n-astraeusd.log" 2>&1 &
  pids+=($!)
  eval "daemon_$n=\$!"
  wait_for 20 "astraeusd of $n" busctl --address="$bus" status org.astraeus.Node1
  add_node "$n"
  plugin "$n"
}
# node_nvml NAME FIXTURE: a node whose astraeusd reads its GPUs through
# NVML: the tests' fake libnvidia-ml (tests/fake_nvml, built here once)
# with FIXTURE's GPUs (for what --sim has not: MIG instances).
node_nvml() {
  local n=$1 bus lib=$tmp/fake-nvml/libnvidia-ml.so.1
  if [ ! -e "$lib" ]; then
    mkdir -p "$tmp/fake-nvml"
    gcc -shared -fPIC -o "$lib" "$root/tests/fake_nvml/fake_nvml.c" || fail "building the fake NVML"
  fi
  mkdir -p "$tmp/$n/plugin" "$tmp/$n/reg" "$tmp/$n/cdi"
  printf '%s\n' "$2" > "$tmp/$n/gpus.txt"
  printf 'machine = "%s"\n[inventory]\nrefresh_seconds = 0.5\nwsl = false\nnvml_library = "%s"\n' "$n" "$lib" > "$tmp/$n/node.toml"
  read -r bus dbus_pid < <(dbus-daemon --session --print-address=1 --print-pid=1 --fork | paste -sd' ')
  pids+=("$dbus_pid")
  eval "bus_$n=\$bus"
  FAKE_NVML_FIXTURE="$tmp/$n/gpus.txt" "$daemon_bin" --bus-address "$bus" --state-dir "$tmp/$n/state" \
    --config "$tmp/$n/node.toml" > "$tmp/$n-astraeusd.log" 2>&1 &
  pids+=($!)
  wait_for 20 "astraeusd of $n" busctl --address="$bus" status org.astraeus.Node1
  add_node "$n"
  plugin "$n"
}
# plugin NAME: NAME's kubelet plugin (again).
plugin() {
  local bus_var="bus_$1"
  "$plugin_bin" --node-name "$1" --kubeconfig "$tmp/plugin.kubeconfig" --bus-address "${!bus_var}" \
    --plugin-dir "$tmp/$1/plugin" --registrar-dir "$tmp/$1/reg" --cdi-dir "$tmp/$1/cdi" --cleanup-every 2s \
    --hook "$root/target/debug/astraeusctl" \
    >> "$tmp/$1-plugin.log" 2>&1 &
  pids+=($!)
  eval "plugin_$1=\$!"
}

claim() { # name memory, or name "whole", or name "mig"
  local exactly="\"deviceClassName\":\"astraeus-gpu\",\"capacity\":{\"requests\":{\"memory\":\"$2\"}}"
  [ "$2" = whole ] && exactly='"deviceClassName":"astraeus-gpu-whole"'
  [ "$2" = mig ] && exactly='"deviceClassName":"astraeus-mig"'
  api POST /apis/resource.k8s.io/v1/namespaces/default/resourceclaims "{\"metadata\":{\"name\":\"$1\"},
    \"spec\":{\"devices\":{\"requests\":[{\"name\":\"gpu\",\"exactly\":{$exactly}}]}}}" >/dev/null
  api POST /api/v1/namespaces/default/pods "{\"metadata\":{\"name\":\"$1\"},\"spec\":{\"automountServiceAccountToken\":false,
    \"resourceClaims\":[{\"name\":\"gpu\",\"resourceClaimName\":\"$1\"}],
    \"containers\":[{\"name\":\"c\",\"image\":\"registry.invalid/none\",\"resources\":{\"claims\":[{\"name\":\"gpu\"}]}}]}}" >/dev/null
}
node_of() { api GET "/api/v1/namespaces/default/pods/$1" | grep -o '"nodeName":"[a-z]*"' | cut -d'"' -f4; }
export -f node_of
api POST /api/v1/namespaces/default/serviceaccounts '{"metadata":{"name":"default"}}' >/dev/null 2>&1 || true

uid_of() { api GET "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["metadata"]["uid"])'; }
# prepare NODE CLAIM: the kubelet's NodePrepareResources on NODE's plugin socket.
prepare() { "$kubelet_call" prepare "$tmp/$1/plugin/dra.sock" default "$2" "$(uid_of "$2")"; }
worker_state() { # node claim: the claim's worker's State in the node's daemon
  local bus_var="bus_$1" path
  path=/org/astraeus/Node1/worker/claim_2d$(uid_of "$2" | sed 's/-/_2d/g')
  busctl --address="${!bus_var}" get-property org.astraeus.Node1 "$path" org.astraeus.Node1.Worker State 2>/dev/null || true
}

# delete_claim NAME: NAME's pod deleted, then its claim deallocated and
# deleted, as the resource claim controller (not run here) would do.
delete_claim() {
  api DELETE "/api/v1/namespaces/default/pods/$1?gracePeriodSeconds=0" >/dev/null
  api PATCH "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/$1/status" \
    '{"status":{"reservedFor":null,"allocation":null}}' >/dev/null
  api PATCH "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/$1" '{"metadata":{"finalizers":null}}' >/dev/null
  api DELETE "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/$1" >/dev/null
}
