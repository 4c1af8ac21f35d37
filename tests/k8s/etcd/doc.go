// Package etcd has no code of its own: its go.mod pins etcd v3.7.3 as a
// tool dependency, which scripts/k8s-build builds for the Kubernetes tests
// (test support only; apart from ../controlplane so that etcd gets its own
// grpc and otel versions).
package etcd
