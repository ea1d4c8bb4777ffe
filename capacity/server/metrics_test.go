package server

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/floodgate/floodgate/internal/lease"
)

func gather(t testing.TB, s *Server) map[string][]*dto.Metric {
	t.Helper()
	r := prometheus.NewRegistry()
	if err := r.Register(s.Collector()); err != nil {
		t.Fatal(err)
	}
	mfs, err := r.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]*dto.Metric{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf.Metric
	}
	return out
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.Label {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// gauge returns metric name's value for resource (-1 if absent).
func gauge(t testing.TB, s *Server, name, resource string) float64 {
	for _, m := range gather(t, s)[name] {
		if label(m, "resource") == resource {
			return m.GetGauge().GetValue()
		}
	}
	return -1
}

func refusals(t testing.TB, s *Server, resource, reason string) float64 {
	for _, m := range gather(t, s)["floodgate_capacity_refusals_total"] {
		if label(m, "resource") == resource && label(m, "reason") == reason {
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// TestMetrics: capacity, granted, wanted and clients per resource follow
// the table.
func TestMetrics(t *testing.T) {
	s, c, _ := newTest(t, config(resource("db", 120, lease.FairShare)), Options{})
	newClient("a", c).get(t, "db", 100)
	newClient("b", c).get(t, "db", 50)
	for name, want := range map[string]float64{
		"floodgate_capacity_capacity": 120,
		"floodgate_capacity_granted":  120, // a got 100, b the 20 left
		"floodgate_capacity_wanted":   150,
		"floodgate_capacity_clients":  2,
		"floodgate_capacity_learning": 0,
	} {
		if got := gauge(t, s, name, "db"); !near(got, want) {
			t.Errorf("%s{resource=db} = %v, want %v", name, got, want)
		}
	}
	ms := gather(t, s)["floodgate_capacity_master"]
	if len(ms) != 1 || ms[0].GetGauge().GetValue() != 1 {
		t.Errorf("floodgate_capacity_master: %v", ms)
	}
}
