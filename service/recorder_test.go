package service_test

import (
	"testing"
	"time"

	"github.com/floodgate/floodgate/internal/recorder"
	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/floodgate/floodgate/service"
)

const recRules = `domain: rec
descriptors:
  - key: hard
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: soft
    rate_limit: {unit: hour, requests_per_unit: 2, mode: soft, soft_percent: 100}
`

// counts are a rule's decisions in the recorder, summed over its seconds.
func counts(t *testing.T, svc *service.Service, rule string) [recorder.NumOutcomes]uint32 {
	t.Helper()
	series, _, _ := svc.Recorder().Since(0)
	var sum [recorder.NumOutcomes]uint32
	for _, s := range series {
		if s.Rule != rule {
			continue
		}
		for _, row := range s.Counts {
			for i, v := range row {
				sum[i] += v
			}
		}
	}
	return sum
}

// TestRecorderCountsEachOutcome: decisions through ShouldRateLimit reach
// the dashboard's recorder by rule and outcome: allowed, refused, shadow
// refused, warned (past a soft limit), degraded (Redis killed).
func TestRecorderCountsEachOutcome(t *testing.T) {
	e := newEnv(t, service.Options{RecordDecisions: true}, recRules)
	e.svc.Recorder().Sample(1)
	for range 3 {
		e.ask(t, reqOf("rec", d("hard", "a")))   // 1 allowed, 2 refused
		e.ask(t, reqOf("rec", d("shadow", "a"))) // 1 allowed, 2 shadow
	}
	for range 4 {
		e.ask(t, reqOf("rec", d("soft", "a"))) // 2 allowed, 2 warned (allowed past the limit)
	}
	e.svc.Recorder().Sample(2)
	want := map[string][recorder.NumOutcomes]uint32{
		"rec.hard":   {recorder.Allowed: 1, recorder.Refused: 2},
		"rec.shadow": {recorder.Allowed: 1, recorder.ShadowRefused: 2},
		"rec.soft":   {recorder.Allowed: 4, recorder.Warned: 2},
	}
	for rule, w := range want {
		if got := counts(t, e.svc, rule); got != w {
			t.Errorf("%s: %v, want %v", rule, got, w)
		}
	}

	// Redis gone: the failure mode decides, degraded
	srv := redistest.Standalone(t)
	rs, err := redisstore.New("redis://"+srv.Addr, redisstore.Options{Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	down := newEnv(t, service.Options{Store: rs, RecordDecisions: true}, recRules)
	down.svc.Recorder().Sample(1)
	down.ask(t, reqOf("rec", d("hard", "a")))
	srv.Kill()
	down.ask(t, reqOf("rec", d("hard", "a")))
	down.svc.Recorder().Sample(2)
	if got := counts(t, down.svc, "rec.hard"); got[recorder.Degraded] != 1 || got[recorder.Allowed]+got[recorder.Refused] != 2 {
		t.Errorf("rec.hard with Redis killed: %v, want one of two decisions degraded", got)
	}
}

// TestRecorderOff: without RecordDecisions there is no recorder.
func TestRecorderOff(t *testing.T) {
	e := newEnv(t, service.Options{}, recRules)
	e.ask(t, reqOf("rec", d("hard", "a")))
	if e.svc.Recorder() != nil {
		t.Fatal("a recorder without RecordDecisions")
	}
}
