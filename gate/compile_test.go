package gate

import (
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/rules"
)

// New names the first bad field of a limit, phase by phase: the limit,
// its policy, its action (the fields each action reads, and the actions a
// remote service cannot take), its key, its match.
func TestCompileErrors(t *testing.T) {
	p := policy(t, "p", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 1, Period: time.Minute})
	rc, err := rules.NewConfig()
	if err != nil {
		t.Fatal(err)
	}
	ban := BanRule{Threshold: 1, Interval: time.Second, Duration: time.Second}
	for _, c := range []struct {
		remote bool
		l      Limit
		want   string
	}{
		{false, Limit{Name: "a", Policy: p, Cost: -1}, "cost: -1 is negative"},
		{false, Limit{Name: "a", Domain: "web"}, `domain: no rules for domain "web"`},
		{false, Limit{Name: "a", Policy: p, Action: 9}, "action: unknown action 9"},
		{false, Limit{Name: "a", Policy: p, Action: Delay, MaxDelay: time.Second}, `action: delay needs a bucket rule (token bucket, GCRA, leaky bucket); policy "p" has windows only, which never delay: every request over it would be refused`},
		{false, Limit{Name: "a", Policy: p, Action: Redirect, Redirect: "/x", RedirectStatus: 200}, "redirect_status: 200 is not a redirect"},
		{false, Limit{Name: "a", Policy: p, Action: Ban, Ban: BanRule{Threshold: 1, Interval: time.Second}}, "ban: threshold must be at least 1, interval and duration at least 1s"},
		{true, Limit{Name: "a", Action: Delay, MaxDelay: time.Second}, "action: delay needs the in-process engine, not a remote service"},
		{true, Limit{Name: "a", Action: Ban, Ban: ban}, "action: ban needs the in-process engine, not a remote service"},
		{false, Limit{Name: "a", Policy: p, Key: make([]Part, 9)}, "key: 9 parts; at most 8"},
		{false, Limit{Name: "a", Policy: p, Key: []Part{{Kind: 99}}}, "key[0]: unknown kind 99"},
		{false, Limit{Name: "a", Policy: p, Key: []Part{Query("")}}, "key[0]: a query part needs a name"},
		{false, Limit{Name: "a", Policy: p, Key: []Part{IP(), Header("X").As("remote_address")}}, `key[1]: entry "remote_address" used twice`},
		{false, Limit{Name: "a", Policy: p, Match: Match{PathPrefix: "api"}}, `match.path_prefix: "api" does not start with /`},
	} {
		cfg := Config{Limits: []Limit{c.l}, Rules: rc}
		if c.remote {
			cfg.Remote = &fakeRemote{}
		}
		g, err := New(cfg)
		if want := "gate: limits[0] (a): " + c.want; err == nil || err.Error() != want {
			t.Errorf("%+v: error %v, want %q", c.l, err, want)
		}
		if g != nil {
			g.Close()
		}
	}
}

// A valid limit compiles with its defaults: cost 1, status 429, a
// redirect 302, the All key; a ban's two policies.
func TestCompileDefaults(t *testing.T) {
	p := policy(t, "p", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 1, Period: time.Minute})
	g, err := New(Config{Limits: []Limit{
		{Name: "r", Policy: p, Action: Redirect, Redirect: "/busy"},
		{Name: "b", Policy: p, Action: Ban, Ban: BanRule{Threshold: 3, Interval: time.Minute, Duration: time.Hour}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	r, b := g.limits[0], g.limits[1]
	if r.Cost != 1 || r.Status != 429 || r.RedirectStatus != 302 || len(r.parts) != 1 || r.parts[0].Kind != PartAll || r.banMarker != nil {
		t.Errorf("redirect: %+v", r)
	}
	if b.banMarker == nil || b.banThresh == nil || b.banBurst != int64((time.Minute+time.Hour)/banGrain) {
		t.Errorf("ban: marker %v, threshold %v, burst %d", b.banMarker, b.banThresh, b.banBurst)
	}
}
