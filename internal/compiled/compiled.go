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
	// Tiered is true when some rule's tier is not exact (Rule.Tier): a
	// store's tiers look no further at the policies that are exact.
	Tiered bool
	// Attached holds the values stores keep with the policy.
	Attached sync.Map
}

// Of is a func(*floodgate.Policy) *Policy, set by package floodgate when
// it initializes; its readers assert that type once.
var Of any

// LegacyWidth is Width as it was before a sliding log counting rejections
// kept one entry more than its ceiling (issue 18): the width of the
// states in an older memstore snapshot or journal.
func (c *Policy) LegacyWidth() int {
	w := c.Width
	for i := range c.Params {
		if p := &c.Params[i]; p.Kind == algo.SlidingLog && p.CountRejected {
			w--
		}
	}
	return w
}

// Widen converts old, a state of LegacyWidth words, into state, of Width.
func (c *Policy) Widen(old, state []int64) {
	clear(state[:c.Width])
	off := 0
	for i := range c.Params {
		p := &c.Params[i]
		s := state[p.Off : p.Off+p.Width]
		if p.Kind != algo.SlidingLog || !p.CountRejected {
			copy(s, old[off:off+p.Width])
			off += p.Width
			continue
		}
		o := old[off : off+p.Width-1]
		off += p.Width - 1
		n, head, oring, ring := o[0], o[1], o[2:], s[2:]
		if n < 0 || n > int64(len(oring)) || head < 0 || head >= int64(len(oring)) {
			s[0] = -1 // invalid, as the old state was: Valid refuses it
			continue
		}
		for j := range n {
			ring[j] = oring[(head+j)%int64(len(oring))]
		}
		s[0], s[1] = n, 0
	}
}
