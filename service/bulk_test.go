package service_test

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/floodgate/floodgate/overrides"
	"github.com/floodgate/floodgate/service"
)

// bulkBody is a PUT /v1/overrides body of the given override objects.
func bulkBody(objs ...string) string {
	return `{"overrides":[` + strings.Join(objs, ",") + `]}`
}

// listAll lists every override of domain in st.
func listAll(t *testing.T, st overrides.Store, domain string) []overrides.Override {
	t.Helper()
	l, err := st.List(t.Context(), domain, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// A bulk write with one bad override writes none of them, and says which
// one (its index) and which field; a dry run writes nothing either way.
func TestAdminBulkPutAllOrNothing(t *testing.T) {
	e := newEnv(t, service.Options{Overrides: overrideCache(t)}, dayRules)
	srv := httptest.NewServer(e.svc.AdminHandler(""))
	t.Cleanup(srv.Close)
	good1 := `{"domain":"day","key":"day=a","limit":5,"period":"24h"}`
	good2 := `{"domain":"day","key":"day=b","limit":7,"period":"24h","note":"vip"}`
	for _, c := range []struct {
		name, body string
		code       int
		index      int
		field      string
	}{
		{"bad period", bulkBody(good1, good2, `{"domain":"day","key":"day=c","limit":5,"period":"1x"}`), 400, 2, "period"},
		{"bad limit", bulkBody(good1, `{"domain":"day","key":"day=c","limit":0,"period":"1s"}`, good2), 400, 1, "limit"},
		// a burst cannot apply to the fixed window the key matches: the
		// live rules' check, as a PUT of one makes it
		{"burst on a window", bulkBody(good1, good2, `{"domain":"day","key":"day=c","limit":5,"period":"24h","burst":9}`), 400, 2, "burst"},
		{"unknown field", bulkBody(good1, `{"domain":"day","key":"day=c","limit":5,"period":"24h","brust":9}`), 400, 1, ""},
		{"a key twice", bulkBody(good1, good2, good1), 400, 2, "key"},
		{"no domain", bulkBody(good1, `{"key":"day=c","limit":5,"period":"24h"}`), 400, 1, "domain"},
	} {
		code, body := adminCall(t, srv.URL, "PUT", "/v1/overrides", c.body)
		var got struct {
			Error string
			Index int
			Field string
		}
		json.Unmarshal([]byte(body), &got)
		if code != c.code || got.Index != c.index || got.Field != c.field || !strings.Contains(got.Error, fmt.Sprintf("overrides[%d]", c.index)) {
			t.Errorf("%s: %d %s; want %d naming overrides[%d] and field %q", c.name, code, body, c.code, c.index, c.field)
		}
		if l := listAll(t, e.ovr, "day"); len(l) != 0 {
			t.Fatalf("%s: a refused bulk write left %v in the store", c.name, l)
		}
	}
	if code, body := adminCall(t, srv.URL, "PUT", "/v1/overrides?dry_run=true", bulkBody(good1, good2)); code != 200 || !strings.Contains(body, `"valid": 2`) {
		t.Fatalf("dry run: %d %s", code, body)
	}
	if l := listAll(t, e.ovr, "day"); len(l) != 0 {
		t.Fatalf("a dry run wrote %v", l)
	}
	if code, body := adminCall(t, srv.URL, "PUT", "/v1/overrides", `{"overrides":[]}x`); code != 400 {
		t.Fatalf("trailing bytes: %d %s", code, body)
	}
	if code, body := adminCall(t, srv.URL, "PUT", "/v1/overrides", `{}`); code != 400 {
		t.Fatalf("no overrides field: %d %s", code, body)
	}
}

// A good bulk write stores every override, keeps a given updated time,
// and the next decisions follow it, each key keeping what it had used
// (as a PUT of one carries the count).
func TestAdminBulkPutAppliesAndCarries(t *testing.T) {
	e := newEnv(t, service.Options{Overrides: overrideCache(t)}, dayRules)
	srv := httptest.NewServer(e.svc.AdminHandler(""))
	t.Cleanup(srv.Close)
	spend := d("day", "a")
	spend.HitsAddend = wrapperspb.UInt64(60)
	e.ask(t, reqOf("day", spend)) // 60 of the rule's 100 used
	code, body := adminCall(t, srv.URL, "PUT", "/v1/overrides", bulkBody(
		`{"domain":"day","key":"day=a","limit":80,"period":"24h"}`,
		`{"domain":"day","key":"day=b","limit":1,"period":"24h","updated":"2020-01-02T03:04:05Z"}`))
	if code != 200 || !strings.Contains(body, `"applied": 2`) {
		t.Fatalf("bulk: %d %s", code, body)
	}
	l := listAll(t, e.ovr, "day")
	if len(l) != 2 || l[1].Key != "day=b" || !l[1].Updated.Equal(time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)) || l[0].Updated.IsZero() {
		t.Fatalf("stored: %+v", l)
	}
	peek := d("day", "a")
	peek.HitsAddend = wrapperspb.UInt64(0)
	if r := e.ask(t, reqOf("day", peek)); r.Statuses[0].LimitRemaining != 20 {
		t.Fatalf("day=a: %d left under its new 80, want 20 (60 used carried)", r.Statuses[0].LimitRemaining)
	}
	e.ask(t, reqOf("day", d("day", "b")))
	if r := e.ask(t, reqOf("day", d("day", "b"))); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("day=b's second request under its override of 1: %v", r.OverallCode)
	}
}

// More overrides than one call takes are refused whole (413), none
// written.
func TestAdminBulkPutTooMany(t *testing.T) {
	e := newEnv(t, service.Options{Overrides: overrideCache(t)}, dayRules)
	srv := httptest.NewServer(e.svc.AdminHandler(""))
	t.Cleanup(srv.Close)
	objs := make([]string, service.MaxBulkOverrides+1)
	for i := range objs {
		objs[i] = fmt.Sprintf(`{"domain":"day","key":"day=%d","limit":5,"period":"24h"}`, i)
	}
	if code, body := adminCall(t, srv.URL, "PUT", "/v1/overrides", bulkBody(objs...)); code != 413 {
		t.Fatalf("%d overrides: %d %.200s", len(objs), code, body)
	}
	if l := listAll(t, e.ovr, "day"); len(l) != 0 {
		t.Fatalf("a refused bulk write left %d overrides", len(l))
	}
}

// Inspect tells the decision the next request would get: a spent key is
// refused, with the time until it may retry (a peek of cost 0 fitted any
// key and said allowed, retry after 0s).
func TestAdminInspectSaysTheNextDecision(t *testing.T) {
	e := newEnv(t, service.Options{}, dayRules)
	srv := httptest.NewServer(e.svc.AdminHandler(""))
	t.Cleanup(srv.Close)
	inspect := func() map[string]any {
		t.Helper()
		code, body := adminCall(t, srv.URL, "POST", "/v1/keys/inspect", `{"domain":"day","entries":[{"key":"day","value":"x"}]}`)
		var out map[string]any
		if code != 200 || json.Unmarshal([]byte(body), &out) != nil {
			t.Fatalf("inspect: %d %s", code, body)
		}
		return out
	}
	if got := inspect(); got["allowed"] != true || got["remaining"] != 100.0 {
		t.Fatalf("a fresh key: %v", got)
	}
	spend := d("day", "x")
	spend.HitsAddend = wrapperspb.UInt64(100)
	e.ask(t, reqOf("day", spend))
	got := inspect()
	if got["allowed"] != false || got["remaining"] != 0.0 || got["retry_after"] == "0s" {
		t.Fatalf("a spent key: %v, want refused with a retry time", got)
	}
	if r := e.ask(t, reqOf("day", d("day", "x"))); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("inspect said refused, the request got %v", r.OverallCode)
	}
}
