# Test support only: a real control plane on 127.0.0.1 -- etcd,
# kube-apiserver and kube-scheduler as scripts/k8s-build builds them into
# $out -- in a temp dir $tmp, with a CA, an admin token ($token) and a
# kubeconfig ($tmp/kubeconfig). Sourced by scripts/k8s-build --smoke and
# tests/k8s/e2e.sh; `stop_all` (on EXIT) stops what was started, the last
# first. Callers set $out, $K8S_VERSION and $label (for messages) first.
for t in openssl curl; do
  command -v $t >/dev/null || { echo "$label: needs $t" >&2; exit 2; }
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/astraeus-k8s.XXXXXX")
pids=()
stop_all() {
  local p i
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do # scheduler, apiserver, then etcd
    p=${pids[i]}
    kill "$p" 2>/dev/null || continue
    for _ in $(seq 150); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  pids=()
}
trap 'stop_all; [ -n "${ASTRAEUS_K8S_SMOKE_KEEP:-}" ] && echo "kept $tmp" >&2 || rm -rf "$tmp"' EXIT
fail() {
  echo "$label: FAIL: $*" >&2
  for f in "$tmp"/*.log; do echo "--- tail $f" >&2; tail -n 25 "$f" >&2; done
  exit 1
}
used=" "
free_port() { # sets $port to a distinct port nothing listens on
  while :; do
    port=$((20000 + RANDOM % 40000))
    case "$used" in *" $port "*) continue ;; esac
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && continue
    used+="$port "; return
  done
}
free_port; etcd_port=$port; free_port; etcd_peer=$port; free_port; api_port=$port; free_port; sched_port=$port

# CA, apiserver serving cert (127.0.0.1/localhost), admin client cert, service-account keys, token.
cd "$tmp"
ossl() { openssl "$@" 2>/dev/null; }
ossl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
  -subj /CN=astraeus-test-ca -addext basicConstraints=critical,CA:TRUE \
  -addext keyUsage=critical,keyCertSign,cRLSign -keyout ca.key -out ca.crt
cert() { # name subject extensions
  ossl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "$2" -keyout "$1.key" -out "$1.csr"
  printf 'keyUsage=critical,digitalSignature\n%s\n' "$3" > "$1.ext"
  ossl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile "$1.ext" -out "$1.crt"
}
cert apiserver /CN=kube-apiserver $'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth'
cert admin "/O=system:masters/CN=astraeus-admin" 'extendedKeyUsage=clientAuth'
ossl genrsa -out sa.key 2048
ossl rsa -in sa.key -pubout -out sa.pub
token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
echo "$token,astraeus-admin,astraeus-admin,system:masters" > tokens.csv
server=https://127.0.0.1:$api_port
cat > kubeconfig <<EOF
apiVersion: v1
kind: Config
clusters: [{name: smoke, cluster: {server: "$server", certificate-authority: "$tmp/ca.crt"}}]
users: [{name: admin, user: {token: "$token"}}]
contexts: [{name: smoke, context: {cluster: smoke, user: admin}}]
current-context: smoke
EOF
# api METHOD PATH [JSON]: token-authenticated request; body on stdout with all
# blanks removed (some endpoints pretty-print); on HTTP >= 400 the body goes to
# stderr and it fails.
api() {
  local type=application/json body
  [ "$1" = PATCH ] && type=application/merge-patch+json
  if body=$(curl -sS --fail-with-body --cacert ca.crt -H "Authorization: Bearer $token" \
      -H "Content-Type: $type" -X "$1" "$server$2" ${3:+--data "$3"}); then
    tr -d ' \n\t' <<<"$body"
  else
    echo "$label: $1 $2 failed: $body" >&2
    return 1
  fi
}
alive() { for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || fail "a component exited early"; done; }
wait_for() { # seconds description command...
  local n=$1 what=$2; shift 2
  for _ in $(seq $((n * 2))); do "$@" >/dev/null 2>&1 && return 0; alive; sleep 0.5; done
  fail "timed out after ${n}s waiting for $what"
}

"$out/etcd" --name smoke --data-dir "$tmp/etcd" \
  --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
  --listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
  --initial-cluster "smoke=http://127.0.0.1:$etcd_peer" --unsafe-no-fsync --log-level warn \
  > etcd.log 2>&1 &
pids+=($!)
wait_for 30 "etcd /health" curl -sf "http://127.0.0.1:$etcd_port/health"

# DRA (resource.k8s.io/v1) is GA and served by default; DRAConsumableCapacity is
# beta and on by default in 1.37, so no --feature-gates/--runtime-config needed.
# start_apiserver: kube-apiserver (again), its pid in $api_pid, once ready.
start_apiserver() {
  "$out/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$etcd_port" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" \
    --tls-cert-file apiserver.crt --tls-private-key-file apiserver.key --client-ca-file ca.crt \
    --token-auth-file tokens.csv --authorization-mode RBAC \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file sa.pub --service-account-signing-key-file sa.key \
    --service-cluster-ip-range 10.96.0.0/16 --cert-dir "$tmp/apiserver-certs" \
    --endpoint-reconciler-type none \
    >> "$tmp/kube-apiserver.log" 2>&1 &
  api_pid=$!
  pids+=($api_pid)
  wait_for 180 "kube-apiserver /readyz" api GET /readyz
}
start_apiserver
alive
[ "$(api GET /healthz)" = ok ] || fail "/healthz is not ok"
api GET /version | grep -q "\"gitVersion\":\"$K8S_VERSION\"" || fail "/version is not $K8S_VERSION"
curl -sSf --cacert ca.crt --cert admin.crt --key admin.key "$server/api/v1/namespaces/default" >/dev/null \
  || fail "client-certificate request failed"
v1=$(api GET /apis/resource.k8s.io/v1)
for r in deviceclasses resourceclaims resourceclaimtemplates resourceslices devicetaintrules; do
  grep -q "\"name\":\"$r\"" <<<"$v1" || fail "resource.k8s.io/v1 does not serve $r"
done
echo "$label: etcd, kube-apiserver up; resource.k8s.io/v1 served" >&2

"$out/kube-scheduler" --kubeconfig "$tmp/kubeconfig" \
  --bind-address 127.0.0.1 --secure-port "$sched_port" --leader-elect=true --v=2 \
  > kube-scheduler.log 2>&1 &
pids+=($!)
wait_for 60 "kube-scheduler /healthz" curl -sfk "https://127.0.0.1:$sched_port/healthz"
wait_for 60 "kube-scheduler leader lease" \
  sh -c "curl -sSf --cacert ca.crt -H 'Authorization: Bearer $token' \
    $server/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/kube-scheduler | grep -q '\"holderIdentity\"'"
alive
echo "$label: kube-scheduler healthy and leader" >&2


# add_node NAME: a Node object (no kubelet: scheduling needs none), its
# not-ready taint lifted as the node lifecycle controller would.
add_node() {
  api POST /api/v1/nodes "{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"metadata\":{\"name\":\"$1\",\"labels\":{\"kubernetes.io/hostname\":\"$1\"}},
    \"status\":{\"capacity\":{\"cpu\":\"4\",\"memory\":\"8Gi\",\"pods\":\"110\"},\"allocatable\":{\"cpu\":\"4\",\"memory\":\"8Gi\",\"pods\":\"110\"}}}" >/dev/null
  api PATCH "/api/v1/nodes/$1" '{"spec":{"taints":null}}' >/dev/null
}
