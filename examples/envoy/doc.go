// Package envoy holds an example of Envoy calling Floodgate's rate-limit
// service: envoy.yaml, an Envoy bootstrap whose ratelimit filter asks
// `floodgate serve` about every request, and rules/, the Floodgate rules
// matching the descriptors it sends. docs/SERVICE.md, "Calling Floodgate
// from Envoy", explains both files.
//
// A second example uses Envoy's Rate Limit Quota Service instead:
// rlqs.yaml, whose rate_limit_quota filter reports each bucket's usage to
// `floodgate serve --resources` and enforces the share it is assigned, and
// rlqs-resources.yaml, the quotas Floodgate splits among the Envoys
// (docs/CAPACITY.md, "Envoy's Rate Limit Quota Service"). rlqs_test.go
// checks rlqs.yaml the same way and serves its buckets over a real stream.
//
// The package's tests parse envoy.yaml into Envoy's own config types
// (go-control-plane) and check it with Envoy's validation rules, load
// rules/ as `floodgate validate` does, and run the descriptors envoy.yaml's
// actions build through Floodgate's service with those rules.
//
// Envoy's bootstrap, route and listener types bring two modules the
// engine itself does not use (cel.dev/expr and
// google.golang.org/genproto/googleapis/api), listed in go.mod as indirect:
// the README's go test -race ./... runs these tests with the others.
package envoy
