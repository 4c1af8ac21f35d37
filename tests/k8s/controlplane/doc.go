// Package controlplane has no code of its own: its go.mod pins
// kube-apiserver and kube-scheduler (k8s.io/kubernetes v1.37.2, every
// staging module replaced at v0.37.2) as tool dependencies, which
// scripts/k8s-build builds for the Kubernetes tests (test support only).
package controlplane
