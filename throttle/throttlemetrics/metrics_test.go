package throttlemetrics_test

import (
	"testing"
	"time"

	"github.com/floodgate/floodgate/throttle"
	"github.com/floodgate/floodgate/throttle/throttlemetrics"
	"github.com/prometheus/client_golang/prometheus"
)

// gather returns the registry's series as "name{label=value,...}" → value.
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName() + "{"
			for _, l := range m.GetLabel() {
				if l.GetName() != "server" {
					name += l.GetName() + "=" + l.GetValue() + ","
				}
			}
			name += "}"
			switch {
			case m.Gauge != nil:
				out[name] = m.GetGauge().GetValue()
			case m.Counter != nil:
				out[name] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}

func TestCollector(t *testing.T) {
	th := throttle.New(throttle.Config{Limit: 1, MaxQueueCost: 3 * time.Millisecond})
	k := throttle.RouteKey{Method: "GET", Route: "/x"}
	run, _ := th.Enter(k, throttle.Critical, 0) // runs
	for range 3 {
		th.Enter(k, throttle.Sheddable, 0) // queued at the initial 1 ms each
	}
	if _, err := th.Enter(k, throttle.Sheddable, 0); err == nil {
		t.Fatal("a full queue admitted")
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(throttlemetrics.New(th, prometheus.Labels{"server": "a"})); err != nil {
		t.Fatal(err)
	}
	m := gather(t, reg)
	want := map[string]float64{
		"floodgate_throttle_limit{}": 1, "floodgate_throttle_in_flight{}": 1, "floodgate_throttle_queue_length{}": 3,
		"floodgate_throttle_queue_cost_seconds{}": 0.003, "floodgate_throttle_admitted_total{}": 1,
		"floodgate_throttle_shed_total{criticality=SHEDDABLE,reason=queue_full,}": 1,
		"floodgate_throttle_shed_total{criticality=CRITICAL,reason=queue_full,}":  0,
	}
	for k, v := range want {
		if got, ok := m[k]; !ok || got != v {
			t.Errorf("%s = %v (present %v), want %v", k, got, ok, v)
		}
	}
	run.DoneCost(2 * time.Millisecond)
	m = gather(t, reg)
	if m["floodgate_throttle_cost_actual_seconds_total{}"] != 0.002 || m["floodgate_throttle_completions_total{}"] != 1 ||
		m["floodgate_throttle_cost_predicted_seconds_total{}"] != 0.001 || m["floodgate_throttle_cost_error_seconds_total{}"] != 0.001 {
		t.Errorf("cost series after one completion: %v", m)
	}
	n := 0
	for k := range m {
		if len(k) > 30 && k[:30] == "floodgate_throttle_shed_total{" {
			n++
		}
	}
	if n != 16 {
		t.Errorf("%d shed series, want 4 levels × 4 reasons", n)
	}
}

// TestCollectorDelay: a request that gives its slot back for a delay and
// is admitted again when it ends counts once in admitted_total, and once
// in suspended_total and readmitted_total; one shed when its delay ends
// counts in suspended_total and shed_total, not in readmitted_total.
func TestCollectorDelay(t *testing.T) {
	th := throttle.New(throttle.Config{Limit: 1})
	k := throttle.RouteKey{Method: "GET", Route: "/d"}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(throttlemetrics.New(th, nil)); err != nil {
		t.Fatal(err)
	}
	a, _ := th.Enter(k, throttle.Critical, 0)
	a.Suspend()
	if err := a.Resume(); err != nil {
		t.Fatal(err)
	}
	a.Done()
	b, _ := th.Enter(k, throttle.Critical, 0)
	b.Suspend()
	c, _ := th.Enter(k, throttle.Critical, 0) // takes the slot b gave back
	if err := b.Resume(); err != throttle.ErrQueueFull {
		t.Fatalf("b's Resume: %v", err)
	}
	c.Done()
	m := gather(t, reg)
	for name, want := range map[string]float64{
		"floodgate_throttle_admitted_total{}": 3, "floodgate_throttle_suspended_total{}": 2,
		"floodgate_throttle_readmitted_total{}": 1, "floodgate_throttle_completions_total{}": 2,
		"floodgate_throttle_shed_total{criticality=CRITICAL,reason=queue_full,}": 1,
	} {
		if got, ok := m[name]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", name, got, ok, want)
		}
	}
}
