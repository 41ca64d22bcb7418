//go:build tools

// Package tools pins etcd for the real-control-plane tests: `go build go.etcd.io/etcd/server/v3`
// (the module's root package is the server's main) resolves through this go.mod and go.sum.
package tools

import _ "go.etcd.io/etcd/server/v3"
