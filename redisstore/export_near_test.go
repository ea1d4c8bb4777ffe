package redisstore

import (
	"fmt"
	"time"

	"github.com/floodgate/floodgate"
)

// NearSlots is the near cache's fixed size.
const NearSlots = nearSlots

// NearFill records n refusals of distinct keys under p at now, as Redis's
// answers would, and returns how many of the near cache's slots then hold
// an entry.
func NearFill(s *Store, p *floodgate.Policy, n int, now int64) int {
	d := floodgate.Decision{Limit: 1, RetryAfter: time.Second, Reason: floodgate.ReasonLimited, Rule: "r"}
	for i := range n {
		op := p.Op(floodgate.OpAllow, fmt.Sprint("flood", i), 1, 0)
		s.nearLearn(s.nearNow(now), &op, &d)
	}
	return s.nearLen()
}
