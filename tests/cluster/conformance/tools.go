//go:build tools

// Package tools pins Knative Serving's conformance suite and the test images it deploys, for
// the tests/real_stack_conformance.rs target: `go test -c -tags=e2e` of the suite's packages
// and `go build` of each image resolve through this module's go.mod and go.sum.
//
// knative.dev/serving v0.42.2 (Knative 1.15): of the two releases the Go module proxy lists
// (v0.42.2, v0.51.0), the one whose dependencies it serves (v0.51.0's knative.dev/pkg,
// knative.dev/networking and knative.dev/caching pseudo-versions answer 403). Its
// serving.knative.dev/v1 API is the one thaw serves. The images are those of the tests run
// (TestCustomResourcesLimits' autoscale, the volume tests' hellovolume and volumes are not).
package tools

import (
	_ "knative.dev/serving/test/conformance/api/v1"
	_ "knative.dev/serving/test/conformance/api/v1beta1"
	_ "knative.dev/serving/test/conformance/runtime"
	_ "knative.dev/serving/test/test_images/failing"
	_ "knative.dev/serving/test/test_images/helloworld"
	_ "knative.dev/serving/test/test_images/multicontainer/servingcontainer"
	_ "knative.dev/serving/test/test_images/multicontainer/sidecarcontainer"
	_ "knative.dev/serving/test/test_images/pizzaplanetv1"
	_ "knative.dev/serving/test/test_images/pizzaplanetv2"
	_ "knative.dev/serving/test/test_images/readiness"
	_ "knative.dev/serving/test/test_images/runtime"
	_ "knative.dev/serving/test/test_images/singlethreaded"
	_ "knative.dev/serving/test/test_images/timeout"
)
