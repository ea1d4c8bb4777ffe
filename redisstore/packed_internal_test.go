package redisstore

import (
	"errors"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
)

// A reply of PackedFunction that is cut short or carries an unknown
// record fails the call with an error, never a panic nor a decision read
// from the wrong bytes; a well-formed one reads as its records say.
func TestPackedDecisionReadsOnlyWellFormedReplies(t *testing.T) {
	p := floodgate.MustPolicy("p", floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 7, Period: time.Hour})
	pa := newPolicyArgs(p)
	fast := []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x03, 0xe8} // refused, 0 remaining, reset 1000 µs
	d, derr, rest, err := packedDecision(pa, fast)
	if err != nil || derr != nil || len(rest) != 0 || d.Allowed || d.Limit != 7 || d.Rule != "r" ||
		d.ResetAfter != time.Millisecond || d.RetryAfter != time.Millisecond || d.Reason != floodgate.ReasonLimited {
		t.Fatalf("a refusal: %+v %v %v %q", d, derr, err, rest)
	}
	failed := append([]byte{3, 0, 4}, "oops"...)
	if _, derr, rest, err := packedDecision(pa, failed); err != nil || derr == nil || len(rest) != 0 {
		t.Fatalf("a failed decision: %v %v %q", derr, err, rest)
	}
	whole := append(append([]byte{2}, make([]byte, batchReplySize)...), fast...)
	if _, derr, rest, err := packedDecision(pa, whole); err != nil || derr != nil || len(rest) != len(fast) {
		t.Fatalf("a full record: %v %v, rest %d bytes", derr, err, len(rest))
	}
	for _, b := range [][]byte{nil, {1}, fast[:16], {2, 0}, {3, 0}, {3, 0, 9, 'x'}, {4}, {0xff, 1, 2}} {
		if _, _, _, err := packedDecision(pa, b); !errors.Is(err, errPackedReply) {
			t.Fatalf("reply % x: %v, want errPackedReply", b, err)
		}
	}
}
