// Package envoy holds an example of Envoy calling Floodgate's rate-limit
// service: envoy.yaml, an Envoy bootstrap whose ratelimit filter asks
// `floodgate serve` about every request, and rules/, the Floodgate rules
// matching the descriptors it sends. docs/SERVICE.md, "Calling Floodgate
// from Envoy", explains both files.
//
// The package's tests parse envoy.yaml into Envoy's own config types
// (go-control-plane) and check it with Envoy's validation rules, load
// rules/ as `floodgate validate` does, and run the descriptors envoy.yaml's
// actions build through Floodgate's service with those rules.
//
// It is a module of its own, as bench is: Envoy's bootstrap, route and
// listener types import github.com/cncf/xds/go/xds/type/v3, which needs
// cel.dev/expr and google.golang.org/genproto/googleapis/api, modules the
// floodgate module does not otherwise list. Run its tests from here:
//
//	cd examples/envoy && go test -race ./...
package envoy
