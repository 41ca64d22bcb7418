//go:build tools

// Package tools pins the Kubernetes binaries the real-control-plane tests build:
// `go build k8s.io/kubernetes/cmd/...` resolves through this module's go.mod and go.sum.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
