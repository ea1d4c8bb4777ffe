package gate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/rules"
)

// fakeRemote answers with answer (err, if set), recording the calls'
// descriptors.
type fakeRemote struct {
	calls  [][]Descriptor
	answer RemoteAnswer
	err    error
}

func (f *fakeRemote) Decide(ctx context.Context, ds []Descriptor) (RemoteAnswer, error) {
	f.calls = append(f.calls, ds)
	return f.answer, f.err
}

// A limit's key parts reach the remote service as descriptor entries,
// their values as the request sent them ('|' and '%' unescaped), with the
// limit's cost; a refusal the remote gives no reason is a limit's.
func TestRemoteDescriptors(t *testing.T) {
	f := &fakeRemote{answer: RemoteAnswer{Decisions: []floodgate.Decision{{Limit: 5}}, Headers: [][2]string{{"RateLimit", `"x";r=0;t=9`}}}}
	g, err := New(Config{Remote: f, Logger: slog.New(slog.DiscardHandler), Limits: []Limit{{
		Name: "tiers", Cost: 3,
		Key: []Part{Header("X-Tier").As("tier"), Const("plan", "a|b"), IP()},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	v := check(g, httpReq("192.0.2.1:1", "/", "X-Tier", "x%7C|y%z"))
	if want := "[[{[{tier x%7C|y%z} {plan a|b} {remote_address 192.0.2.1}] 3}]]"; fmt.Sprint(f.calls) != want {
		t.Fatalf("calls %v, want %s", f.calls, want)
	}
	if v.Allowed || v.Deciding == nil || !v.Deciding.Over || v.Deciding.Decision.Reason != floodgate.ReasonLimited || fmt.Sprint(v.RemoteHeaders) != `[[RateLimit "x";r=0;t=9]]` {
		t.Fatalf("allowed %v, deciding %+v, headers %v", v.Allowed, v.Deciding, v.RemoteHeaders)
	}
}

// A remote that fails, or answers for a number of descriptors other than
// it was asked, leaves the request to the failure policy: passed (every
// limit Degraded), or refused as the store's failure with FailClosed.
func TestRemoteFailure(t *testing.T) {
	for _, f := range []*fakeRemote{
		{err: errors.New("unavailable")},
		{answer: RemoteAnswer{}},
		{answer: RemoteAnswer{Decisions: make([]floodgate.Decision, 2)}},
	} {
		for _, closed := range []bool{false, true} {
			g, err := New(Config{Remote: f, FailClosed: closed, Logger: slog.New(slog.DiscardHandler), Limits: []Limit{{Name: "per-ip", Key: []Part{IP()}}}})
			if err != nil {
				t.Fatal(err)
			}
			v := check(g, httpReq("192.0.2.1:1", "/"))
			g.Close()
			if v.Err == nil || v.Allowed == closed || !v.Degraded() || v.StoreUnavailable() != closed {
				t.Errorf("%+v, closed %v: allowed %v, err %v, degraded %v, store unavailable %v", f, closed, v.Allowed, v.Err, v.Degraded(), v.StoreUnavailable())
			}
		}
	}
}

// A gRPC call's metadata is a plain map, lower-case keys (grpc's
// metadata.MD is one): the host comes from :authority, headers from their
// keys.
func TestGRPCMetadataMap(t *testing.T) {
	p := policy(t, "p", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 1, Period: time.Minute})
	g, err := New(Config{Limits: []Limit{{Name: "api", Policy: p, Match: Match{Hosts: []string{"api.example.com"}, Path: "/pkg.S/*"}, Key: []Part{Header("X-User"), Host()}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	md := map[string][]string{":authority": {"api.example.com:443"}, "x-user": {"ann"}}
	v := check(g, &Request{FullMethod: "/pkg.S/M", MD: md, Peer: "192.0.2.1:1"})
	if len(v.Outcomes) != 1 || v.Outcomes[0].Key != "ann|api.example.com" || !v.Allowed {
		t.Fatalf("outcomes %+v", v.Outcomes)
	}
	if v := check(g, &Request{FullMethod: "/pkg.S/M", MD: md, Peer: "192.0.2.1:1"}); v.Allowed {
		t.Fatal("the second call passed a limit of 1")
	}
	if v := check(g, &Request{FullMethod: "/pkg.S/M", MD: map[string][]string{":authority": {"other.example.com"}}}); len(v.Outcomes) != 0 {
		t.Fatalf("another host's call: outcomes %+v", v.Outcomes)
	}
}

// Outcome.entries gives a rules-file limit its descriptor entries: the
// parts' entry names and their values, unescaped; a long value bounded.
func TestOutcomeEntries(t *testing.T) {
	long := strings.Repeat("v", 300)
	l := &limit{parts: []compiledPart{compilePart(Header("X-A")), compilePart(Const("b", "")), compilePart(Query("q"))}}
	key := string(appendValue(append(appendValue(nil, "1|2%3"), "||"...), long))
	got := (&Outcome{Key: key, l: l}).entries()
	want := []rules.Entry{{Key: "x-a", Value: "1|2%3"}, {Key: "b", Value: ""}, {Key: "query.q", Value: boundedValue(long)}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("entries %q, want %q", got, want)
	}
}
