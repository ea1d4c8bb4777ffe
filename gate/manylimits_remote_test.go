package gate

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"testing"

	"github.com/floodgate/floodgate"
)

// countingRemote admits every descriptor but those with an entry valued
// "over", refuses calls of more than 64 descriptors as floodgate serve
// does, and tags each answer with its call's number.
type countingRemote struct {
	mu    sync.Mutex
	sizes []int
}

func (c *countingRemote) Decide(ctx context.Context, ds []Descriptor) (RemoteAnswer, error) {
	c.mu.Lock()
	c.sizes = append(c.sizes, len(ds))
	call := len(c.sizes) - 1
	c.mu.Unlock()
	if len(ds) > 64 {
		return RemoteAnswer{}, fmt.Errorf("%d descriptors; at most 64", len(ds))
	}
	ans := RemoteAnswer{Headers: [][2]string{{"X-Call", strconv.Itoa(call)}}}
	for _, d := range ds {
		dec := floodgate.Decision{Allowed: true}
		for _, e := range d.Entries {
			if e.Value == "over" {
				dec = floodgate.Decision{Reason: floodgate.ReasonLimited}
			}
		}
		ans.Decisions = append(ans.Decisions, dec)
	}
	return ans, nil
}

// With a remote service, a request matching 100 limits is asked about in
// calls of at most 48 descriptors (floodgate serve refuses more than 64),
// every limit decided: the 90th, over its limit, refuses it, and the
// response fields are those of its call. (New refused more than 16
// limits.)
func TestRemoteManyLimitsInSeveralCalls(t *testing.T) {
	var limits []Limit
	for i := range 100 {
		tier := "ok"
		if i == 90 {
			tier = "over"
		}
		limits = append(limits, Limit{Name: fmt.Sprintf("l%d", i), Key: []Part{IP(), Const("tier", tier)}})
	}
	rls := &countingRemote{}
	g, err := New(Config{Limits: limits, Remote: rls, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	v := check(g, httpReq("192.0.2.1:1", "/"))
	if v.Err != nil || v.Allowed || len(v.Outcomes) != 100 || v.Deciding == nil || v.Deciding.Limit.Name != "l90" {
		t.Fatalf("allowed %v, %d outcomes, deciding %+v, err %v", v.Allowed, len(v.Outcomes), v.Deciding, v.Err)
	}
	if fmt.Sprint(rls.sizes) != "[48 48 4]" {
		t.Errorf("calls of %v descriptors, want [48 48 4]", rls.sizes)
	}
	if fmt.Sprint(v.RemoteHeaders) != "[[X-Call 1]]" {
		t.Errorf("fields %v, want those of call 1, the 90th limit's", v.RemoteHeaders)
	}
	for i, o := range v.Outcomes {
		if o.Over != (i == 90) {
			t.Errorf("%s: over %v", o.Limit.Name, o.Over)
		}
	}
}
