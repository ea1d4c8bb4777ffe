// Package compiled holds a floodgate.Policy's compiled form: what package
// floodgate builds from the rules, and what package storekit and this
// module's stores read.
package compiled

import (
	"sync"

	"github.com/floodgate/floodgate/internal/algo"
)

// Policy is a floodgate.Policy compiled.
type Policy struct {
	Params  []algo.Params // one per rule, Off and Width set
	Names   []string      // the rules' names
	Width   int           // state words per key
	Version uint64        // larger for a later NewPolicy or WithLimit
	// Attached holds the values stores keep with the policy.
	Attached sync.Map
}

// Of is a func(*floodgate.Policy) *Policy, set by package floodgate when
// it initializes; its readers assert that type once.
var Of any
