package throttle

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestParseCriticality(t *testing.T) {
	good := map[string]Criticality{
		"CRITICAL_PLUS": CriticalPlus, "critical": Critical, " Sheddable_Plus ": SheddablePlus,
		"sheddable": Sheddable, "critical-plus": CriticalPlus,
	}
	for s, want := range good {
		if c, ok := ParseCriticality(s); !ok || c != want {
			t.Errorf("ParseCriticality(%q) = %v, %v; want %v", s, c, ok, want)
		}
	}
	// Hostile or unknown values: never a panic, never a level, the default.
	bad := []string{"", "CRITICAL_PLUS_PLUS", "3", "\x00CRITICAL", "CRITICAL\x00", strings.Repeat("A", 1<<20),
		"critical,sheddable", "CRITİCAL", "\xff\xfe", "NOT_CRITICAL"}
	for _, s := range bad {
		if c, ok := ParseCriticality(s); ok || c != DefaultCriticality {
			t.Errorf("ParseCriticality(%.20q) = %v, %v; want the default, false", s, c, ok)
		}
	}
	if DefaultCriticality != Critical {
		t.Errorf("the documented default is CRITICAL, is %v", DefaultCriticality)
	}
}

func TestCriticalityOrderAndNames(t *testing.T) {
	if !(Sheddable < SheddablePlus && SheddablePlus < Critical && Critical < CriticalPlus) {
		t.Fatal("levels out of order: lower levels must be shed first")
	}
	for c := Criticality(0); c < numLevels; c++ {
		if back, ok := ParseCriticality(c.String()); !ok || back != c {
			t.Errorf("%v does not round-trip", c)
		}
	}
	if Criticality(9).String() != "INVALID" || Criticality(9).Valid() {
		t.Error("an out-of-range level must read INVALID")
	}
}

func TestContextAndHeader(t *testing.T) {
	if c, ok := FromContext(context.Background()); ok || c != DefaultCriticality {
		t.Errorf("empty context: %v %v", c, ok)
	}
	ctx := WithCriticality(context.Background(), Sheddable)
	if c, ok := FromContext(ctx); !ok || c != Sheddable {
		t.Errorf("FromContext = %v %v", c, ok)
	}
	if c, _ := FromContext(WithCriticality(context.Background(), 200)); c != DefaultCriticality {
		t.Errorf("an invalid level stored as %v", c)
	}
	h := http.Header{}
	if c := FromHeader(h, "", SheddablePlus); c != SheddablePlus {
		t.Errorf("missing header: %v, want the caller's default", c)
	}
	h.Add("X-Prio", "bogus")
	h.Add("X-Prio", "sheddable")
	if c := FromHeader(h, "X-Prio", Critical); c != Sheddable {
		t.Errorf("second value names a level: got %v", c)
	}
	if c := FromValues([]string{"a", "b", "c", "d", "CRITICAL_PLUS"}, Sheddable); c != Sheddable {
		t.Errorf("values past the fourth must be ignored, got %v", c)
	}
	if c := FromValues(nil, 77); c != DefaultCriticality {
		t.Errorf("invalid default: %v", c)
	}
}

func TestTransportPropagates(t *testing.T) {
	got := make(chan string, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get(DefaultHeader)
	}))
	defer srv.Close()
	client := &http.Client{Transport: &Transport{}}
	send := func(ctx context.Context, preset string) string {
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL, nil)
		if preset != "" {
			req.Header.Set(DefaultHeader, preset)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if preset != "" && req.Header.Get(DefaultHeader) != preset {
			t.Error("the caller's request was changed")
		}
		if preset == "" && req.Header.Get(DefaultHeader) != "" {
			t.Error("the caller's request was changed")
		}
		return <-got
	}
	if h := send(WithCriticality(context.Background(), SheddablePlus), ""); h != "SHEDDABLE_PLUS" {
		t.Errorf("propagated %q", h)
	}
	if h := send(context.Background(), ""); h != "" {
		t.Errorf("no level in the context, sent %q", h)
	}
	if h := send(WithCriticality(context.Background(), Sheddable), "CRITICAL"); h != "CRITICAL" {
		t.Errorf("caller's header replaced without Override: %q", h)
	}
	client.Transport = &Transport{Override: true}
	if h := send(WithCriticality(context.Background(), Sheddable), "CRITICAL"); h != "SHEDDABLE" {
		t.Errorf("Override: sent %q", h)
	}
}

func FuzzParseCriticality(f *testing.F) {
	f.Add("CRITICAL")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		c, ok := ParseCriticality(s)
		if !c.Valid() || (!ok && c != DefaultCriticality) {
			t.Fatalf("%q -> %v %v", s, c, ok)
		}
	})
}
