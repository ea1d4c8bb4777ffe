package gate

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/memstore"
	"github.com/floodgate/floodgate/rules"
)

// memGate is a gate on a memory store of its own, which it returns too.
func memGate(t *testing.T, cfg Config) (*Gate, *memstore.Store) {
	t.Helper()
	clk := clock.NewManual(t0)
	ms, err := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ms.Close() })
	cfg.Store, cfg.Clock = ms, clk
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return g, ms
}

// remaining is what p has left for key, peeked.
func remaining(t *testing.T, st floodgate.Store, p *floodgate.Policy, key string) int64 {
	t.Helper()
	d, err := st.Do(context.Background(), t0.UnixMicro(), p.Op(floodgate.OpPeek, key, 1, 0))
	if err != nil {
		t.Fatal(err)
	}
	return d.Remaining
}

// A gate of 100 limits, one per endpoint: a request is limited by its
// endpoint's, the 90th, and by none of the others. (New refused more than
// 16 limits.)
func TestHundredLimitsEachEnforced(t *testing.T) {
	var limits []Limit
	for i := range 100 {
		limits = append(limits, Limit{
			Name:   fmt.Sprintf("e%d", i),
			Policy: policy(t, fmt.Sprintf("e%d", i), floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 2, Period: time.Minute}),
			Match:  Match{PathPrefix: fmt.Sprintf("/e%d/", i)},
			Key:    []Part{IP()},
		})
	}
	g, _ := memGate(t, Config{Limits: limits})
	for i := range 3 {
		v := check(g, httpReq("192.0.2.1:1", "/e90/x"))
		if v.Allowed != (i < 2) || len(v.Outcomes) != 1 || v.Outcomes[0].Limit.Name != "e90" {
			t.Fatalf("request %d to /e90/: allowed %v, %d outcomes", i, v.Allowed, len(v.Outcomes))
		}
		if !v.Allowed && v.Deciding.Limit.Name != "e90" {
			t.Fatalf("refused by %s", v.Deciding.Limit.Name)
		}
	}
	if v := check(g, httpReq("192.0.2.1:1", "/e9/x")); !v.Allowed || len(v.Outcomes) != 1 || v.Outcomes[0].Limit.Name != "e9" {
		t.Fatalf("/e9/: allowed %v, %+v", v.Allowed, v.Outcomes)
	}
	if v := check(g, httpReq("192.0.2.1:1", "/other")); len(v.Outcomes) != 0 {
		t.Fatalf("/other matched %d limits", len(v.Outcomes))
	}
}

// A rules directory of three files of 16 routes each is one proxy's gate
// (as cmd/floodgate builds it: LoadDir, FromRules, New), and the third
// file's last route limits. (New refused its 48 limits: the proxy did not
// start.)
func TestRulesDirectoryOfManyFilesIsOneGate(t *testing.T) {
	dir := t.TempDir()
	writeRoutes(t, dir, 3, 16)
	cfg, errs := rules.LoadDir(dir)
	if len(errs) > 0 {
		t.Fatal(errors.Join(errs...))
	}
	limits, err := FromRules(cfg)
	if err != nil || len(limits) != 48 {
		t.Fatalf("%d limits, %v", len(limits), err)
	}
	g, _ := memGate(t, Config{Limits: limits, Rules: cfg})
	for i := range 3 {
		v := check(g, httpReq("192.0.2.1:1", "/d2/r15"))
		if v.Allowed != (i < 2) || len(v.Outcomes) != 1 || v.Outcomes[0].Limit.Name != "d2/r15" {
			t.Fatalf("request %d: allowed %v, %+v", i, v.Allowed, v.Outcomes)
		}
	}
}

// writeRoutes writes files rules files to dir, each declaring routes
// http routes: file d<i>, route r<j> limits path /d<i>/r<j> to 2 a minute
// per address.
func writeRoutes(t testing.TB, dir string, files, routes int) {
	t.Helper()
	for f := range files {
		var b strings.Builder
		fmt.Fprintf(&b, "domain: d%d\nhttp:\n", f)
		for r := range routes {
			fmt.Fprintf(&b, "  - name: r%d\n    match: {path: /d%d/r%d}\n    key: [remote_address]\n    rate_limit: {unit: minute, requests_per_unit: 2}\n", r, f, r)
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("d%d.yaml", f)), []byte(b.String()), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// manyLimits returns n limits on every request, each of its own policy:
// the first bans of them ban limits (three store operations each), their
// limit is lim(i).
func manyLimits(t *testing.T, n, bans int, lim func(i int) int64) ([]Limit, []*floodgate.Policy) {
	var limits []Limit
	var ps []*floodgate.Policy
	for i := range n {
		p := policy(t, fmt.Sprintf("p%d", i), floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: lim(i), Period: time.Hour})
		l := Limit{Name: fmt.Sprintf("l%d", i), Policy: p, Key: []Part{IP()}}
		if i < bans {
			l.Action, l.Ban = Ban, BanRule{Threshold: 1000, Interval: time.Hour, Duration: time.Hour}
		}
		limits, ps = append(limits, l), append(ps, p)
	}
	return limits, ps
}

// A request matching more limits than one store call takes (48
// operations: here 16 bans, then 24 limits) is decided in two calls,
// every limit enforced (the last one refuses), and all or nothing across
// the calls: what one call's limits took is given back when the other's
// refuse. (Gate.local stopped at 48 operations: later limits were not
// enforced; New refused more than 16 limits.)
func TestRequestOverOneCallIsDecidedWhole(t *testing.T) {
	const n = 40
	for _, refuser := range []int{n - 1, 0} { // in the second call, in the first
		t.Run(fmt.Sprintf("refused-by-l%d", refuser), func(t *testing.T) {
			limits, ps := manyLimits(t, n, 16, func(i int) int64 {
				if i == refuser {
					return 1
				}
				return 100
			})
			var logs bytes.Buffer
			g, st := memGate(t, Config{Limits: limits, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			for i := range 3 {
				v := check(g, httpReq("192.0.2.1:1", "/"))
				if v.Err != nil || v.Allowed != (i == 0) || len(v.Outcomes) != n {
					t.Fatalf("request %d: allowed %v, %d outcomes, %v", i, v.Allowed, len(v.Outcomes), v.Err)
				}
				if i > 0 && v.Deciding.Limit.Name != limits[refuser].Name {
					t.Fatalf("request %d refused by %s", i, v.Deciding.Limit.Name)
				}
			}
			for i, p := range ps {
				want := int64(99)
				if i == refuser {
					want = 0
				}
				if got := remaining(t, st, p, "192.0.2.1"); got != want {
					t.Errorf("%s: %d left, want %d: only the admitted request takes", limits[i].Name, got, want)
				}
			}
			if got := strings.Count(logs.String(), "several calls"); got != 1 {
				t.Errorf("logged %d times, want once:\n%s", got, logs.String())
			}
		})
	}
}

// failingStore is a Store (and no GroupStore) that fails the operations
// of a policy named "boom" and the batches holding one.
type failingStore struct{ floodgate.Store }

func (s failingStore) Do(ctx context.Context, now int64, op floodgate.Op) (floodgate.Decision, error) {
	if op.Policy.Name() == "boom" {
		return floodgate.Decision{}, errors.New("boom")
	}
	return s.Store.Do(ctx, now, op)
}

func (s failingStore) DoBatch(ctx context.Context, now int64, ops []floodgate.Op, out []floodgate.Decision) error {
	for _, op := range ops {
		if op.Policy.Name() == "boom" {
			return errors.New("boom")
		}
	}
	return s.Store.DoBatch(ctx, now, ops, out)
}

// When the store fails in a request's second call, the gate's failure
// policy decides it: failing closed, what the first call took is given
// back (the request is refused whole); failing open, it stands.
func TestSecondCallFailing(t *testing.T) {
	for _, closed := range []bool{true, false} {
		t.Run(fmt.Sprintf("FailClosed=%v", closed), func(t *testing.T) {
			limits, ps := manyLimits(t, 48, 0, func(int) int64 { return 100 }) // the first call; boom the second
			boom := policy(t, "boom", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 100, Period: time.Hour})
			limits = append(limits, Limit{Name: "boom", Policy: boom, Key: []Part{IP()}})
			clk := clock.NewManual(t0)
			ms, err := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer ms.Close()
			g, err := New(Config{Limits: limits, Store: failingStore{ms}, Clock: clk, FailClosed: closed, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			v := check(g, httpReq("192.0.2.1:1", "/"))
			if v.Err == nil || v.Allowed == closed {
				t.Fatalf("allowed %v, err %v", v.Allowed, v.Err)
			}
			want := int64(99)
			if closed {
				want = 100
			}
			for i, p := range ps {
				if got := remaining(t, ms, p, "192.0.2.1"); got != want {
					t.Errorf("%s (first call): %d left, want %d", limits[i].Name, got, want)
				}
			}
		})
	}
}

// The route index finds what trying every limit finds, in the same order,
// for hosts and paths in any spelling that matching sees through: a seed
// corpus of awkward ones (case, Unicode case folding, a root dot, ports,
// wildcards at several depths, unclean and relative paths), fuzzed further
// with go test -fuzz FuzzRouteIndex.
func FuzzRouteIndex(f *testing.F) {
	hosts := []string{"a.example.com", "x.a.example.com", "A.EXAMPLE.COM.", "b.example.com:8080", "c.b.example.com", "example.com",
		".example.com", "k.test", "K.TEST", "\u212a.test", "x.\u017f.test", "x.S.test", "s.test", "[::1]:80", "\xff.example.com",
		"a.b.c.d.example.com", "", "tenant7.api.test", "TENANT7.api.test"}
	paths := []string{"/", "/api", "/api/", "/api/v1", "/api/v1/users", "/api/v1/users/", "/apx", "/q/x", "//api/v1/users",
		"/api/../api/v1/x", "api/v1/users", "", "/e3/x", "/e3", "/pkg.Svc/Method", "/api/v1/users/7/posts"}
	for i, h := range hosts {
		f.Add(h, paths[i%len(paths)], "GET")
		f.Add(h, paths[(i+5)%len(paths)], "post")
	}
	for _, p := range paths {
		f.Add("a.example.com", p, "GET")
	}
	matches := []Match{
		{}, {Hosts: []string{"a.example.com"}}, {Hosts: []string{"A.Example.COM", "*.example.com"}}, {Hosts: []string{"*.b.example.com"}},
		{Hosts: []string{"*.example.com", "*.c.d.example.com"}}, {Hosts: []string{"k.test"}}, {Hosts: []string{"\u212a.test"}},
		{Hosts: []string{"*.s.test"}}, {Hosts: []string{"*.\u017f.test"}}, {Hosts: []string{"::1"}}, {Hosts: []string{"*."}}, {Hosts: []string{""}},
		{Hosts: []string{"tenant7.api.test"}, PathPrefix: "/api/v1/"},
		{Path: "/api/*"}, {Path: "/api/v1/**"}, {Path: "/api/v1/users"}, {Path: "/"}, {Path: "/**"}, {Path: "/*/x"}, {Path: "/api/"},
		{Path: "/api/v1/users/*/posts"}, {Path: "/pkg.Svc/*"},
		{PathPrefix: "/api"}, {PathPrefix: "/api/"}, {PathPrefix: "/api/v1/"}, {PathPrefix: "/ap"}, {PathPrefix: "/"}, {PathPrefix: "/e3/"},
		{PathPrefix: "/api/v1/", Path: "/api/*/users"}, {Methods: []string{"POST"}, PathPrefix: "/api/"},
		{Hosts: []string{"*.example.com"}, Path: "/api/v1/**", Methods: []string{"GET"}},
	}
	p, err := floodgate.NewPolicy("p", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 1 << 40, Period: time.Hour})
	if err != nil {
		f.Fatal(err)
	}
	var limits []Limit
	for i, m := range matches {
		limits = append(limits, Limit{Name: fmt.Sprint(i), Policy: p, Match: m})
	}
	indexed, err := New(Config{Limits: limits})
	if err != nil {
		f.Fatal(err)
	}
	defer indexed.Close()
	if indexed.index == nil {
		f.Fatal("no route index")
	}
	linear, err := New(Config{Limits: limits})
	if err != nil {
		f.Fatal(err)
	}
	defer linear.Close()
	setLinear(linear)
	names := func(g *Gate, r *Request) string {
		var v Verdict
		g.Check(r, &v)
		var b strings.Builder
		for _, o := range v.Outcomes {
			b.WriteString(o.Limit.Name + " ")
		}
		return b.String()
	}
	f.Fuzz(func(t *testing.T, host, path, method string) {
		raw := &Request{Raw: &RawHTTP{Method: method, Host: host, Path: path, Header: func(string) []string { return nil }}, Peer: "192.0.2.1:1"}
		if a, b := names(indexed, raw), names(linear, raw); a != b {
			t.Errorf("raw %q %q %q: the index finds %q, every limit %q", method, host, path, a, b)
		}
		hr := httptest.NewRequest("GET", "http://h/", nil)
		hr.Method, hr.Host, hr.URL.Path = method, host, path
		r := &Request{HTTP: hr, Peer: "192.0.2.1:1"}
		if a, b := names(indexed, r), names(linear, r); a != b {
			t.Errorf("http %q %q %q: the index finds %q, every limit %q", method, host, path, a, b)
		}
	})
}

// Two spellings of one host that strings.EqualFold (and so a limit's
// match) takes as one fold alike.
func TestFoldHostAgreesWithEqualFold(t *testing.T) {
	words := []string{"a", "A", "k", "K", "\u212a", "s", "S", "\u017f", "\xff", "\xfe", "\ufffd", "ß", "ẞ", "σ", "Σ", "ς", ".", "-", "1", "é", "É"}
	for _, a := range words {
		for _, b := range words {
			x, y := "h"+a+".com", "H"+b+".COM"
			if eq := string(foldHost(nil, x)) == string(foldHost(nil, y)); eq != strings.EqualFold(x, y) {
				t.Errorf("%q and %q: folds equal %v, EqualFold %v", x, y, eq, strings.EqualFold(x, y))
			}
		}
	}
}
