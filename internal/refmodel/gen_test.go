package refmodel

import (
	"fmt"
	"math/rand/v2"
	"time"
	_ "time/tzdata" // calendar zones must not depend on the machine's tz database

	"github.com/floodgate/floodgate"
)

// A zone and a date near something a calendar window can trip over: a
// clock change at midnight (skipped or repeated), a skipped date, a
// half-hour change, a leap day, the end of a year.
var calendarStarts = []struct {
	zone string
	y    int
	m    time.Month
	d    int
}{
	{"UTC", 2024, 2, 27},
	{"UTC", 2023, 12, 29},
	{"America/New_York", 2024, 3, 8},
	{"America/New_York", 2024, 11, 1},
	{"America/Santiago", 2016, 8, 12},   // 2016-08-14: midnight skipped
	{"America/Santiago", 2016, 5, 13},   // 2016-05-15: 24:00 back to 23:00
	{"America/Sao_Paulo", 2018, 11, 2},  // 2018-11-04: midnight skipped
	{"America/Sao_Paulo", 2018, 2, 16},  // 2018-02-18: midnight back to 23:00
	{"America/Havana", 2015, 3, 6},      // 2015-03-08: midnight skipped
	{"Asia/Gaza", 2012, 9, 19},          // 2012-09-21: midnight repeated
	{"Asia/Beirut", 2023, 10, 27},       // 2023-10-29: 00:00 back to 23:00
	{"Pacific/Apia", 2011, 12, 27},      // 2011-12-30 never happened
	{"Australia/Lord_Howe", 2024, 4, 5}, // half-hour change
	{"Asia/Kathmandu", 2024, 1, 30},     // +05:45
}

func mustZone(name string) *time.Location {
	loc, err := time.LoadLocation(name)
	if err != nil {
		panic(err)
	}
	return loc
}

const hour = 3_600_000_000

// genPolicy draws a policy: 1 to 4 rules on one time scale (periods within
// a small factor of each other, so that every rule has something to do),
// and the instant its trace starts at.
func genPolicy(r *rand.Rand) (specs []Spec, unit, start int64) {
	units := []int64{1, 10, 1000, 1_000_000, hour}
	unit = units[r.IntN(len(units))]
	calendarPolicy := r.IntN(100) < 15
	var loc *time.Location
	if calendarPolicy {
		unit = hour
		cs := calendarStarts[r.IntN(len(calendarStarts))]
		loc = mustZone(cs.zone)
		start = time.Date(cs.y, cs.m, cs.d, 0, 0, 0, 0, loc).UnixMicro() + r.Int64N(48)*hour/2
	} else {
		start = time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro() + r.Int64N(35*365*24*hour)
		if r.IntN(3) == 0 { // on a boundary of many periods
			start -= start % (unit * 7 * 12 * 5)
		}
	}
	n := 1 + r.IntN(4)
	for i := range n {
		var s Spec
		kinds := []Kind{TokenBucket, TokenBucketInterval, LeakyMeter, LeakyShaper, GCRA, FixedWindow, SlidingLog, SlidingWindow, SlidingSubwindow}
		s.Kind = kinds[r.IntN(len(kinds))]
		if calendarPolicy && (i == 0 || r.IntN(3) == 0) {
			s.Kind = FixedWindow
			s.Cal = Calendar(1 + r.IntN(3))
			s.Loc = loc
			s.WeekStart = time.Weekday(r.IntN(7))
		}
		limits := []int64{1, 1, 2, 3, 4, 5, 7, 10, 12}
		s.Limit = limits[r.IntN(len(limits))]
		if r.IntN(8) == 0 {
			s.Limit = []int64{16, 33, 100, 997}[r.IntN(4)]
			if s.Kind == SlidingLog {
				s.Limit = 33
			}
		}
		factors := []int64{1, 2, 3, 5, 7, 10, 24}
		if unit == 1 {
			factors = []int64{1, 2, 3, 4, 5, 6, 7, 9, 11, 13}
		}
		s.Period = unit * factors[r.IntN(len(factors))]
		switch s.Kind {
		case SlidingSubwindow:
			s.Gran = unit * []int64{1, 1, 2, 3, 5}[r.IntN(5)]
			s.Period = s.Gran * (1 + r.Int64N(6))
		case TokenBucket, TokenBucketInterval, LeakyMeter, LeakyShaper, GCRA:
			if r.IntN(2) == 0 {
				s.Burst = 1 + r.Int64N(2*s.Limit+1)
			}
		}
		if s.Cal != CalNone {
			s.Period = 0
		}
		switch x := r.IntN(100); {
		case x < 20:
			s.SoftPercent = []int64{1, 5, 10, 30, 50, 100, 300}[r.IntN(7)]
		case x < 40:
			s.ElasticCeiling = s.B() + 1 + r.Int64N(s.B()+3)
		}
		if s.Kind == SlidingLog && r.IntN(2) == 0 {
			s.CountRejected = true
		}
		specs = append(specs, s)
	}
	return specs, unit, start
}

// toRule turns rule i of a model policy into the engine's rule.
func toRule(i int, s Spec, spare func() bool) floodgate.Rule {
	r := floodgate.Rule{
		Name:          fmt.Sprintf("r%d", i),
		Limit:         s.Limit,
		Period:        time.Duration(s.Period) * time.Microsecond,
		Burst:         s.Burst,
		Granularity:   time.Duration(s.Gran) * time.Microsecond,
		CountRejected: s.CountRejected,
	}
	switch s.Kind {
	case TokenBucket:
		r.Algorithm = floodgate.TokenBucket
	case TokenBucketInterval:
		r.Algorithm, r.Refill = floodgate.TokenBucket, floodgate.RefillInterval
	case LeakyMeter:
		r.Algorithm = floodgate.LeakyBucket
	case LeakyShaper:
		r.Algorithm = floodgate.LeakyBucketShaper
	case GCRA:
		r.Algorithm = floodgate.GCRA
	case FixedWindow:
		r.Algorithm = floodgate.FixedWindow
	case SlidingLog:
		r.Algorithm = floodgate.SlidingLog
	case SlidingWindow:
		r.Algorithm = floodgate.SlidingWindow
	case SlidingSubwindow:
		r.Algorithm = floodgate.SlidingSubwindow
	}
	if s.Cal != CalNone {
		r.Calendar = [...]floodgate.Calendar{"", floodgate.CalendarDay, floodgate.CalendarWeek, floodgate.CalendarMonth}[s.Cal]
		r.Location, r.WeekStart = s.Loc, s.WeekStart
	}
	switch {
	case s.SoftPercent > 0:
		r.Mode, r.SoftPercent = floodgate.Soft, s.SoftPercent
	case s.ElasticCeiling > 0:
		r.Mode, r.ElasticCeiling, r.Spare = floodgate.Elastic, s.ElasticCeiling, spare
	}
	return r
}

// toDecision turns the model's decision into the engine's.
func toDecision(d Decision) floodgate.Decision {
	us := func(x int64) time.Duration { return time.Duration(x) * time.Microsecond }
	return floodgate.Decision{
		Allowed:    d.Allowed,
		Limit:      d.Limit,
		Remaining:  d.Remaining,
		ResetAfter: us(d.ResetAfter),
		RetryAfter: us(d.RetryAfter),
		Delay:      us(d.Delay),
		Rule:       fmt.Sprintf("r%d", d.Rule),
		Reason:     [...]floodgate.Reason{floodgate.ReasonNone, floodgate.ReasonLimited, floodgate.ReasonCostTooLarge}[d.Reason],
		Excess:     d.Excess,
	}
}
