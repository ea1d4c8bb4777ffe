package storetest

import (
	"testing"
	"time"

	"github.com/floodgate/floodgate"
)

// testApprox checks a bucket whose exact units would pass 2^51 (30,011 a
// day: 86.4e9 units a request, 2.6e15 for the bucket), decided with the
// fraction nearest its rate that fits (internal/algo's approxRate:
// 15,840 units a microsecond, 45,602,479,091 a request, 7e-16 off): every
// store decides it alike, to the microsecond.
func testApprox(t *testing.T, newStore NewStore) {
	e := newEnv(t, newStore)
	us := time.Microsecond
	l := e.limiter("approx", floodgate.Rule{Name: "day", Limit: 30_011, Period: 24 * time.Hour})
	e.expect("the whole day at once", e.allowN(l, "k", 30_011), ok("day", 30_011, 0, 86_400_000_001*us))
	e.expect("one more", e.allow(l, "k"), no("day", 30_011, 0, 86_400_000_001*us, 2_878_945*us))
	e.at(2_878_945 * us)
	e.expect("a request's time later", e.allow(l, "k"), ok("day", 30_011, 0, 86_400_000_000*us))
	e.expect("one more again", e.allow(l, "k"), no("day", 30_011, 0, 86_400_000_000*us, 2_878_944*us))
}
