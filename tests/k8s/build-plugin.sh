#!/usr/bin/env bash
# Test support only: builds this checkout's astraeus-kubelet-plugin and the
# kubelet's client (test/kubelet-call) next to scripts/k8s-build's control
# plane, and prints nothing. Used by scripts/k8s-test and tests/k8s/setup.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${ASTRAEUS_K8S_BIN:-$HOME/.cache/astraeus-k8s/v1.37.2}
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
export GOWORK=off GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0
mkdir -p "$out"
cd "$root/kubernetes"
"$GO" build -trimpath -o "$out/astraeus-kubelet-plugin" ./cmd/astraeus-kubelet-plugin
"$GO" build -trimpath -o "$out/kubelet-call" ./test/kubelet-call
