package floodgate_test

import (
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/memstore"
)

// Misuse is named where it is made: NewLimiter and SetPolicy with a nil or
// zero policy, or a nil store, panic saying which, rather than failing at
// the first request with a nil dereference.
func TestNewLimiterNamesMisuse(t *testing.T) {
	st := memstore.MustNew(memstore.Options{})
	defer st.Close()
	p := floodgate.MustPolicy("p", floodgate.Rule{Limit: 1, Period: time.Second})
	panics := func(what, want string, f func()) {
		t.Helper()
		defer func() {
			t.Helper()
			r := recover()
			if s, _ := r.(string); !strings.Contains(s, want) {
				t.Errorf("%s: panic %v, want one saying %q", what, r, want)
			}
		}()
		f()
	}
	panics("nil policy", "nil policy", func() { floodgate.NewLimiter(nil, st) })
	panics("zero policy", "zero Policy", func() { floodgate.NewLimiter(&floodgate.Policy{}, st) })
	panics("nil store", "nil store", func() { floodgate.NewLimiter(p, nil) })
	l := floodgate.NewLimiter(p, st)
	panics("SetPolicy(nil)", "SetPolicy: nil policy", func() { l.SetPolicy(nil) })
	if _, err := floodgate.NewPolicy("empty"); err == nil || err.Error() != "floodgate: policy: rules: a policy needs at least one rule" {
		t.Errorf("a policy of no rules: %v", err)
	}
}
