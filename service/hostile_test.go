package service_test

import (
	"context"
	"math"
	"strings"
	"sync/atomic"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/memstore"
	"github.com/floodgate/floodgate/service"
)

// What a client controls (a header's value, a missing header) cannot get a
// request refused whole: Envoy fails open on an error, so a refused
// request would pass every limit, its other descriptors' too.

// A descriptor with no entries (Envoy sends one when its only action is a
// request_headers with skip_if_absent and the header is missing) matches
// nothing and is OK; the request's other descriptors are decided.
func TestEmptyDescriptorMatchesNothing(t *testing.T) {
	e := newEnv(t, service.Options{}, diffRules)
	req := &rlsv3.RateLimitRequest{Domain: "t", Descriptors: []*rlcommon.RateLimitDescriptor{{}, d("user", "u"), nil}}
	for i := 1; i <= 6; i++ {
		r := e.ask(t, req)
		if len(r.Statuses) != 3 || r.Statuses[0].Code != rlsv3.RateLimitResponse_OK || r.Statuses[0].CurrentLimit != nil ||
			r.Statuses[2].Code != rlsv3.RateLimitResponse_OK {
			t.Fatalf("request %d: %v", i, r)
		}
		want := rlsv3.RateLimitResponse_OK
		if i == 6 {
			want = rlsv3.RateLimitResponse_OVER_LIMIT // 5 a minute
		}
		if r.OverallCode != want || r.Statuses[1].Code != want {
			t.Fatalf("request %d: %v, want %v", i, r, want)
		}
	}
}

// A value longer than the store's keys may be is limited like any other:
// one limit per distinct value, under a key of bounded length.
func TestLongValueIsLimited(t *testing.T) {
	st := &keyLengths{Store: memstore.MustNew(memstore.Options{SweepInterval: -1})}
	e := newEnv(t, service.Options{Store: st}, diffRules)
	long := strings.Repeat("v", 100<<10)
	other := long[:len(long)-1] + "w" // differs in its last byte only
	for i := 1; i <= 6; i++ {
		r := e.ask(t, one("t", 0, d("user", long)))
		want := rlsv3.RateLimitResponse_OK
		if i == 6 {
			want = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if r.OverallCode != want {
			t.Fatalf("request %d with a 100 KiB value: %v, want %v", i, r, want)
		}
	}
	if r := e.ask(t, one("t", 0, d("user", other))); r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 4 {
		t.Fatalf("another long value sharing the first one's start: %v, want its own limit", r)
	}
	// the store key is the domain, a NUL and the descriptor's key
	if n := st.longest.Load(); n > service.MaxKeyBytes+2 || n < service.MaxKeyBytes/2 {
		t.Fatalf("the longest store key was %d bytes; want at most %d", n, service.MaxKeyBytes+2)
	}
	// keys are still bounded: an entry's key is the caller's configuration
	_, err := e.svc.ShouldRateLimit(t.Context(), one("t", 0, d(strings.Repeat("k", service.MaxEntryBytes+1), "v")))
	if err == nil || !strings.Contains(err.Error(), "key is longer than") {
		t.Fatalf("a key over %d bytes: %v", service.MaxEntryBytes, err)
	}
}

// keyLengths is a store that records the longest key it was asked about.
type keyLengths struct {
	floodgate.Store
	longest atomic.Int64
}

func (k *keyLengths) Do(ctx context.Context, now int64, op floodgate.Op) (floodgate.Decision, error) {
	if n := int64(len(op.Key)); n > k.longest.Load() {
		k.longest.Store(n)
	}
	return k.Store.Do(ctx, now, op)
}

// Hits beyond every limit (Envoy takes a descriptor's hits_addend from a
// format string, which may read a header) are over the limit and consume
// nothing, whatever their size; shadow mode still admits.
func TestHugeHitsAreOverTheLimit(t *testing.T) {
	e := newEnv(t, service.Options{}, diffRules)
	for _, req := range []*rlsv3.RateLimitRequest{
		one("t", math.MaxUint32, d("user", "h")),
		{Domain: "t", Descriptors: []*rlcommon.RateLimitDescriptor{hitsOf(math.MaxUint64, d("user", "h"))}},
		{Domain: "t", Descriptors: []*rlcommon.RateLimitDescriptor{hitsOf(1<<62, d("user", "h"))}},
	} {
		r := e.ask(t, req)
		if st := r.Statuses[0]; r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || st.CurrentLimit.GetRequestsPerUnit() != 5 || st.LimitRemaining != 5 {
			t.Fatalf("%v: %v; want OVER_LIMIT of 5 with 5 left", req, r)
		}
	}
	if r := e.ask(t, one("t", 0, d("user", "h"))); r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 4 {
		t.Fatalf("after the refused requests: %v; want nothing consumed", r)
	}
}

func hitsOf(n uint64, dd *rlcommon.RateLimitDescriptor) *rlcommon.RateLimitDescriptor {
	dd.HitsAddend = wrapperspb.UInt64(n)
	return dd
}
