package rules

import _ "embed"

// ExampleFile is testdata/example/example.yaml: a friendly rules file for
// the domain "example" (a per-remote_address limit and a per-user limit of
// two rules) that `floodgate serve` writes to a temporary directory and
// serves when given no rules.
//
//go:embed testdata/example/example.yaml
var ExampleFile []byte

// Example returns a copy of ExampleFile.
func Example() []byte { return append([]byte(nil), ExampleFile...) }
