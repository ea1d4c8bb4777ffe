package floodgate

import (
	"testing"
	"time"
)

func TestRetryAfterSeconds(t *testing.T) {
	for d, want := range map[time.Duration]int64{
		0: 0, -time.Second: 0, time.Nanosecond: 1, 500 * time.Microsecond: 1,
		time.Second: 1, time.Second + 1: 2, 59*time.Second + 999*time.Millisecond: 60,
	} {
		if got := (Decision{RetryAfter: d}).RetryAfterSeconds(); got != want {
			t.Errorf("RetryAfter %v: %d seconds, want %d", d, got, want)
		}
	}
}
