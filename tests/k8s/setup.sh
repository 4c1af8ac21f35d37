# Test support only: what tests/k8s/e2e.sh and tests/k8s/bench.sh start
# from (they set $root and $label, then source this): the control plane
# (scripts/k8s-build's binaries, built when missing), this build of
# astraeusd, the plugin and the kubelet's client built, the cluster up
# (cluster.sh) and the node helpers (nodes.sh).
K8S_VERSION=v1.37.2
out=${ASTRAEUS_K8S_BIN:-$HOME/.cache/astraeus-k8s/$K8S_VERSION}
"$root/scripts/k8s-build" >/dev/null
(cd "$root" && cargo build -q --bins)
daemon_bin=$root/target/debug/astraeusd
plugin_bin=$out/astraeus-kubelet-plugin
kubelet_call=$out/kubelet-call
"$root/tests/k8s/build-plugin.sh"
# shellcheck source=cluster.sh
. "$root/tests/k8s/cluster.sh"
# What `wait_for`'s bash -c checks call.
export -f api
export server token tmp
# shellcheck source=nodes.sh
. "$root/tests/k8s/nodes.sh"
