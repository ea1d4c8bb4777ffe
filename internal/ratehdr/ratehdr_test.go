package ratehdr

import (
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
)

func TestFields(t *testing.T) {
	for in, want := range map[string]string{
		`per-ip`:        `"per-ip"`,
		`a"b\c`:         `"a\"b\\c"`,
		"tab\there\xff": `"tab_here_"`,
	} {
		if got := SFString(in); got != want {
			t.Errorf("SFString(%q) = %s, want %s", in, got, want)
		}
	}
	if got := SFString(strings.Repeat("x", 1000)); len(got) != MaxName+2 {
		t.Errorf("a long name renders %d bytes", len(got))
	}
	for d, want := range map[time.Duration]int64{0: 0, -time.Second: 0, time.Millisecond: 1, time.Second: 1, 1001 * time.Millisecond: 2} {
		if got := CeilSeconds(d); got != want {
			t.Errorf("CeilSeconds(%v) = %d, want %d", d, got, want)
		}
	}
	if got := PolicyItem(`"p"`, 100, 500*time.Millisecond); got != `"p";q=100;w=1` {
		t.Errorf("PolicyItem: %s", got)
	}
	if got := string(AppendLimit(nil, `"p"`, -3, 1500*time.Millisecond)); got != `"p";r=0;t=2` {
		t.Errorf("AppendLimit: %s", got)
	}
	for r, want := range map[floodgate.Calendar]time.Duration{floodgate.CalendarDay: 24 * time.Hour, floodgate.CalendarWeek: 7 * 24 * time.Hour, floodgate.CalendarMonth: 30 * 24 * time.Hour, "": time.Minute} {
		if got := Window(floodgate.Rule{Calendar: r, Period: time.Minute}); got != want {
			t.Errorf("Window(%q) = %v, want %v", r, got, want)
		}
	}
}
