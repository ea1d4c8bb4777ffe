package gate

import (
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
)

// Delay on a policy of windows alone is refused by New: a window never
// delays, so the limit would refuse every request it meant to delay.
func TestDelayNeedsABucket(t *testing.T) {
	windows := floodgate.MustPolicy("w", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 1, Period: time.Second})
	mixed := floodgate.MustPolicy("m",
		floodgate.Rule{Name: "s", Limit: 1, Period: time.Second},
		floodgate.Rule{Name: "h", Algorithm: floodgate.FixedWindow, Limit: 100, Period: time.Hour})
	_, err := New(Config{Limits: []Limit{{Name: "d", Policy: windows, Key: []Part{IP()}, Action: Delay, MaxDelay: 2 * time.Second}}})
	if err == nil || !strings.Contains(err.Error(), "bucket") || !strings.Contains(err.Error(), "limits[0] (d)") {
		t.Fatalf("delay on a fixed window: %v", err)
	}
	g, err := New(Config{Limits: []Limit{{Name: "d", Policy: mixed, Key: []Part{IP()}, Action: Delay, MaxDelay: 2 * time.Second}}})
	if err != nil {
		t.Fatalf("delay on a bucket beside a window: %v", err)
	}
	g.Close()
}
