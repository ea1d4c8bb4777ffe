package floodgate_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/memstore"
)

func TestBadRulesNameTheField(t *testing.T) {
	spare := func() bool { return true }
	cases := []struct {
		rule  floodgate.Rule
		field string
	}{
		{floodgate.Rule{Limit: 0, Period: time.Second}, "limit"},
		{floodgate.Rule{Limit: -3, Period: time.Second}, "limit"},
		{floodgate.Rule{Limit: 1, Period: 0}, "period"},
		{floodgate.Rule{Limit: 1, Period: -time.Second}, "period"},
		{floodgate.Rule{Limit: 1, Period: time.Nanosecond}, "period"},
		{floodgate.Rule{Limit: 1, Period: time.Second, Burst: -1}, "burst"},
		{floodgate.Rule{Algorithm: "token-bucket", Limit: 1, Period: time.Second}, "algorithm"},
		{floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 1, Period: time.Second, Burst: 5}, "burst"},
		{floodgate.Rule{Algorithm: floodgate.SlidingLog, Limit: 20000, Period: time.Second}, "limit"},
		{floodgate.Rule{Algorithm: floodgate.SlidingSubwindow, Limit: 5, Period: time.Hour}, "granularity"},
		{floodgate.Rule{Algorithm: floodgate.SlidingSubwindow, Limit: 5, Period: time.Hour, Granularity: 7 * time.Minute}, "granularity"},
		{floodgate.Rule{Algorithm: floodgate.SlidingSubwindow, Limit: 5, Period: time.Hour, Granularity: time.Millisecond}, "granularity"},
		{floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 5, Period: time.Hour, Granularity: time.Minute}, "granularity"},
		{floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 5, Period: time.Hour, Calendar: floodgate.CalendarDay}, "calendar"},
		{floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 5, Calendar: "fortnight"}, "calendar"},
		{floodgate.Rule{Algorithm: floodgate.GCRA, Limit: 5, Period: time.Hour, Refill: floodgate.RefillInterval}, "refill"},
		{floodgate.Rule{Limit: 5, Period: time.Hour, Refill: "sometimes"}, "refill"},
		{floodgate.Rule{Limit: 5, Period: time.Hour, Mode: "gentle"}, "mode"},
		{floodgate.Rule{Limit: 5, Period: time.Hour, Mode: floodgate.Soft}, "soft_percent"},
		{floodgate.Rule{Limit: 5, Period: time.Hour, SoftPercent: 10}, "mode"},
		{floodgate.Rule{Limit: 5, Period: time.Hour, Mode: floodgate.Elastic, ElasticCeiling: 4, Spare: spare}, "elastic_ceiling"},
		{floodgate.Rule{Limit: 5, Period: time.Hour, Mode: floodgate.Elastic, ElasticCeiling: 10}, "spare"},
		{floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 5, Period: time.Hour, CountRejected: true}, "count_rejected"},
		{floodgate.Rule{Limit: 1, Period: 87_600 * time.Hour, Burst: 1_000_000_000}, "burst"},
		{floodgate.Rule{Limit: 1, Period: time.Second, Burst: 1 << 51}, "burst"},
		{floodgate.Rule{Limit: 5, Period: time.Hour, Tier: "nearby"}, "tier"},
		{floodgate.Rule{Limit: 5, Period: time.Hour, Tier: floodgate.TierWriteBack, Budget: 0.01}, "tier"},
		{floodgate.Rule{Algorithm: floodgate.SlidingLog, Limit: 5, Period: time.Hour, Tier: floodgate.TierWriteBack, Budget: 0.01}, "tier"},
		{floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 5, Calendar: floodgate.CalendarDay, Tier: floodgate.TierWriteBack, Budget: 0.01}, "tier"},
		{floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 5, Period: time.Hour, Mode: floodgate.Soft, SoftPercent: 10, Tier: floodgate.TierWriteBack, Budget: 0.01}, "tier"},
		{floodgate.Rule{Limit: 5, Period: time.Hour, Tier: floodgate.TierWriteBack}, "budget"},
		{floodgate.Rule{Limit: 5, Period: time.Hour, Tier: floodgate.TierWriteBack, Budget: 0.6}, "budget"},
		{floodgate.Rule{Limit: 5, Period: time.Hour, Tier: floodgate.TierWriteBack, Budget: -0.01}, "budget"},
		{floodgate.Rule{Limit: 5, Period: time.Hour, Tier: floodgate.TierWriteBack, Budget: math.NaN()}, "budget"},
		{floodgate.Rule{Limit: 5, Period: time.Hour, Budget: 0.01}, "budget"},
		{floodgate.Rule{Limit: 5, Period: time.Hour, Tier: floodgate.TierExact, Budget: 0.01}, "budget"},
		{floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 5, Period: time.Hour, Tier: floodgate.TierLocalShare, Budget: 0.01}, "budget"},
		{floodgate.Rule{Limit: 5, Period: time.Hour, Tier: floodgate.TierLocalShare}, "tier"},
		{floodgate.Rule{Algorithm: floodgate.SlidingLog, Limit: 5, Period: time.Hour, Tier: floodgate.TierLocalShare}, "tier"},
		{floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 5, Calendar: floodgate.CalendarDay, Tier: floodgate.TierLocalShare}, "tier"},
		{floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 5, Period: time.Hour, Mode: floodgate.Soft, SoftPercent: 10, Tier: floodgate.TierLocalShare}, "tier"},
	}
	for i, c := range cases {
		_, err := floodgate.NewPolicy("p", c.rule)
		var re *floodgate.RuleError
		if !errors.As(err, &re) {
			t.Errorf("case %d (%+v): err = %v, want a *RuleError", i, c.rule, err)
			continue
		}
		if re.Field != c.field {
			t.Errorf("case %d: field %q, want %q (%v)", i, re.Field, c.field, err)
		}
		if !strings.Contains(err.Error(), c.field) {
			t.Errorf("case %d: message %q does not name %q", i, err, c.field)
		}
	}
}

func TestPolicyShape(t *testing.T) {
	if _, err := floodgate.NewPolicy("empty"); err == nil {
		t.Error("a policy without rules must be an error")
	}
	r := floodgate.Rule{Limit: 1, Period: time.Second}
	if _, err := floodgate.NewPolicy("dup", r, r); err == nil || !strings.Contains(err.Error(), "duplicate") {
		t.Errorf("duplicate rule names: %v", err)
	}
	many := make([]floodgate.Rule, 17)
	for i := range many {
		many[i] = floodgate.Rule{Limit: int64(i + 1), Period: time.Second}
	}
	if _, err := floodgate.NewPolicy("many", many...); err == nil {
		t.Error("17 rules must be refused")
	}
	a, _ := floodgate.NewPolicy("", r)
	b, _ := floodgate.NewPolicy("", r)
	if a.Name() == b.Name() {
		t.Error("unnamed policies must not share a name (and so state)")
	}
	if got := a.Rules()[0].Name; got != "1/1s" {
		t.Errorf("default rule name %q", got)
	}
}

func TestNegativeCostIsRejected(t *testing.T) {
	l := floodgate.NewLimiter(floodgate.MustPolicy("neg", floodgate.Rule{Limit: 5, Period: time.Second}), memstore.MustNew(memstore.Options{}))
	ctx := context.Background()
	var pe *floodgate.ParamError
	if _, err := l.AllowN(ctx, "k", -1); !errors.As(err, &pe) || pe.Field != "cost" {
		t.Errorf("AllowN(-1): %v", err)
	}
	if _, err := l.WaitN(ctx, "k", -1); !errors.As(err, &pe) || pe.Field != "cost" {
		t.Errorf("WaitN(-1): %v", err)
	}
	if _, err := l.Charge(ctx, "k", -2); !errors.As(err, &pe) {
		t.Errorf("Charge(-2): %v", err)
	}
}

// Errors name the package, a policy's and a rule's alike.
func TestRuleErrorNamesThePackage(t *testing.T) {
	_, err := floodgate.NewPolicy("p", floodgate.Rule{Name: "r", Limit: -1, Period: time.Second})
	if err == nil || !strings.HasPrefix(err.Error(), "floodgate: rule r: limit: ") {
		t.Errorf("a rule's error: %v", err)
	}
	_, err = floodgate.NewPolicy("p")
	if err == nil || !strings.HasPrefix(err.Error(), "floodgate: policy: ") {
		t.Errorf("a policy's error: %v", err)
	}
}

func TestTiersCompile(t *testing.T) {
	for _, r := range []floodgate.Rule{
		{Limit: 5, Period: time.Hour, Tier: floodgate.TierExact},
		{Algorithm: floodgate.FixedWindow, Limit: 5, Period: time.Hour, Tier: floodgate.TierWriteBack, Budget: 0.01},
		{Algorithm: floodgate.SlidingWindow, Limit: 5, Period: time.Hour, Tier: floodgate.TierWriteBack, Budget: 0.5},
		{Algorithm: floodgate.FixedWindow, Limit: 5, Period: time.Hour, Tier: floodgate.TierLocalShare},
	} {
		if _, err := floodgate.NewPolicy("p", r); err != nil {
			t.Errorf("%+v: %v", r, err)
		}
	}
}
