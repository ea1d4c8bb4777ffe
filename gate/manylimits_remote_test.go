package gate

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// countingRLS answers every descriptor OK but those with an entry valued
// "over", refuses requests of more than 64 descriptors as floodgate serve
// does, and tags each response with its call's number.
type countingRLS struct {
	mu    sync.Mutex
	sizes []int
}

func (c *countingRLS) ShouldRateLimit(ctx context.Context, in *rlsv3.RateLimitRequest, _ ...grpc.CallOption) (*rlsv3.RateLimitResponse, error) {
	c.mu.Lock()
	c.sizes = append(c.sizes, len(in.Descriptors))
	call := len(c.sizes) - 1
	c.mu.Unlock()
	if len(in.Descriptors) > 64 {
		return nil, status.Errorf(codes.InvalidArgument, "%d descriptors; at most 64", len(in.Descriptors))
	}
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "X-Call", Value: strconv.Itoa(call)}}}
	for _, d := range in.Descriptors {
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		for _, e := range d.Entries {
			if e.Value == "over" {
				st.Code, resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT, rlsv3.RateLimitResponse_OVER_LIMIT
			}
		}
		resp.Statuses = append(resp.Statuses, st)
	}
	return resp, nil
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
	rls := &countingRLS{}
	g, err := New(Config{Limits: limits, Remote: &Remote{Client: rls, Domain: "web"}, Logger: slog.New(slog.DiscardHandler)})
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
