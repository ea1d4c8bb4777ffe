package overrides

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
)

func valid() Override {
	return Override{Domain: "api", Key: "user=241531", Limit: 5, Period: time.Second}
}

func TestValidateNamesTheField(t *testing.T) {
	cases := []struct {
		field string
		edit  func(*Override)
	}{
		{"domain", func(o *Override) { o.Domain = "" }},
		{"domain", func(o *Override) { o.Domain = strings.Repeat("d", MaxDomainLen+1) }},
		{"domain", func(o *Override) { o.Domain = "a\x00b" }},
		{"domain", func(o *Override) { o.Domain = "\xff" }},
		{"key", func(o *Override) { o.Key = "" }},
		{"key", func(o *Override) { o.Key = strings.Repeat("k", MaxKeyLen+1) }},
		{"key", func(o *Override) { o.Key = "user=\xff\xfe" }},
		{"note", func(o *Override) { o.Note = "caf\xe9" }},
		{"limit", func(o *Override) { o.Limit = 0 }},
		{"limit", func(o *Override) { o.Limit = -3 }},
		{"period", func(o *Override) { o.Period = 0 }},
		{"period", func(o *Override) { o.Period = 1500 * time.Nanosecond }},
		{"burst", func(o *Override) { o.Burst = -1 }},
		{"burst", func(o *Override) { o.Algorithm = floodgate.FixedWindow; o.Burst = 10 }},
		{"algorithm", func(o *Override) { o.Algorithm = "bogus" }},
		{"limit", func(o *Override) { o.Algorithm = floodgate.SlidingLog; o.Limit = 20000 }},
		{"note", func(o *Override) { o.Note = strings.Repeat("n", MaxNoteLen+1) }},
	}
	for _, c := range cases {
		o := valid()
		c.edit(&o)
		err := o.Validate()
		var fe *FieldError
		if !errors.As(err, &fe) {
			t.Errorf("%+v: got %v, want a *FieldError", o, err)
			continue
		}
		if fe.Field != c.field {
			t.Errorf("%+v: field %q, want %q (%v)", o, fe.Field, c.field, err)
		}
		if !strings.Contains(err.Error(), c.field+":") {
			t.Errorf("error %q does not name %s", err, c.field)
		}
	}
	for _, o := range []Override{
		valid(),
		{Domain: "d", Key: "k", Limit: 100, Period: time.Minute, Burst: 500, Algorithm: floodgate.GCRA, Note: "partner"},
		{Domain: "d", Key: "k\x00with nul", Limit: 10, Period: time.Hour, Algorithm: floodgate.SlidingSubwindow},
		{Domain: "d", Key: "k", Limit: 10, Period: time.Second, Algorithm: floodgate.SlidingWindow},
	} {
		if err := o.Validate(); err != nil {
			t.Errorf("%+v: %v", o, err)
		}
	}
}

func TestJSON(t *testing.T) {
	o := valid()
	o.Period = 90 * time.Second
	o.Burst = 7
	o.Algorithm = floodgate.GCRA
	o.Updated = time.Date(2025, 3, 1, 12, 0, 0, 5, time.UTC)
	b, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"period":"1m30s"`) {
		t.Fatalf("period not a duration string: %s", b)
	}
	var back Override
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back != o {
		t.Fatalf("round trip: %+v, want %+v", back, o)
	}
	// Marshal through a pointer and inside a slice too.
	if b2, _ := json.Marshal([]*Override{&o}); !strings.Contains(string(b2), `"1m30s"`) {
		t.Fatalf("pointer: %s", b2)
	}
	for in, field := range map[string]string{
		`{"domain":"d","key":"k","limit":1,"period":"soon"}`: "period",
		`{"domain":"d","key":"k","limit":1,"period":1000}`:   "period",
		`{"domain":"d","key":"k","limit":"x","period":"1s"}`: "limit",
	} {
		var o Override
		err := json.Unmarshal([]byte(in), &o)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != field {
			t.Errorf("%s: got %v, want an error naming %s", in, err, field)
		}
	}
}

func TestCodecRoundTrip(t *testing.T) {
	for _, o := range []Override{
		valid(),
		{Domain: "d", Key: "k", Limit: 1 << 40, Period: 24 * time.Hour, Burst: 1 << 41, Algorithm: floodgate.LeakyBucket,
			Note: "ticket 42 ✓", Updated: time.Unix(1700000000, 123456789).UTC()},
		{Domain: "d", Key: "k", Limit: 1, Period: time.Microsecond, Updated: time.Unix(-5, 0).UTC()},
	} {
		got, err := decodeValue(o.Domain, o.Key, encodeValue(nil, o))
		if err != nil || got != o {
			t.Errorf("got %+v, %v; want %+v", got, err, o)
		}
	}
	enc := encodeValue(nil, valid())
	for i := range len(enc) {
		if _, err := decodeValue("d", "k", enc[:i]); err == nil {
			t.Errorf("truncated to %d bytes: no error", i)
		}
	}
	if _, err := decodeValue("d", "k", append([]byte{9}, enc[1:]...)); err == nil || !strings.Contains(err.Error(), "version 9") {
		t.Errorf("unknown version: %v", err)
	}
}

func TestApply(t *testing.T) {
	base := floodgate.Rule{Name: "per-user", Algorithm: floodgate.TokenBucket, Limit: 100, Period: time.Minute, Burst: 200,
		Refill: floodgate.RefillInterval, Mode: floodgate.Soft, SoftPercent: 10}
	r := valid().Apply(base)
	if r.Name != "per-user" || r.Limit != 5 || r.Period != time.Second || r.Burst != 0 || r.Refill != floodgate.RefillInterval || r.Mode != floodgate.Soft {
		t.Fatalf("token bucket override: %+v", r)
	}
	if _, err := floodgate.NewPolicy("p", r); err != nil {
		t.Fatal(err)
	}
	o := valid()
	o.Algorithm = floodgate.SlidingWindow
	r = o.Apply(base)
	if r.Algorithm != floodgate.SlidingWindow || r.Refill != "" {
		t.Fatalf("algorithm override: %+v", r)
	}
	if _, err := floodgate.NewPolicy("p", r); err != nil {
		t.Fatal(err)
	}
	cal := floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 1000, Calendar: floodgate.CalendarDay}
	if r := valid().Apply(cal); r.Calendar != "" || r.Period != time.Second {
		t.Fatalf("calendar rule: %+v", r)
	}
}
