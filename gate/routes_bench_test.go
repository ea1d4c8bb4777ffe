package gate

import (
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/memstore"
)

// BenchmarkCheckRoutes is one request through gates of n limits: n-1
// routes of one endpoint each (shape endpoints: Path /api/v1/eI/*; shape
// hosts: one tenant host each, tI.example.com) and a per-IP limit on
// every request. The request matches the per-IP limit and the last route,
// so it makes two decisions whatever n is; the rest is finding them. The
// linear variants try every limit, as gates did before the route index.
//
//	go test -run '^$' -bench BenchmarkCheckRoutes -benchmem -count 5 ./gate/
func BenchmarkCheckRoutes(b *testing.B) {
	for _, shape := range []string{"endpoints", "hosts"} {
		for _, n := range []int{16, 1000, 10000} {
			for _, linear := range []bool{false, true} {
				name := fmt.Sprintf("%s/limits=%d", shape, n)
				if linear {
					name += "/linear"
				}
				b.Run(name, func(b *testing.B) { benchRoutes(b, shape, n, linear) })
			}
		}
	}
}

func benchRoutes(b *testing.B, shape string, n int, linear bool) {
	clk := clock.NewManual(t0)
	ms, err := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer ms.Close()
	p, err := floodgate.NewPolicy("p", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 1e9, Period: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	limits := []Limit{{Name: "per-ip", Policy: p, Key: []Part{IP()}}}
	for i := range n - 1 {
		l := Limit{Name: fmt.Sprintf("r%d", i), Policy: p, Key: []Part{IP(), Const("route", fmt.Sprint(i))}}
		if shape == "hosts" {
			l.Match.Hosts = []string{fmt.Sprintf("t%d.example.com", i)}
		} else {
			l.Match.Path = fmt.Sprintf("/api/v1/e%d/*", i)
		}
		limits = append(limits, l)
	}
	g, err := New(Config{Limits: limits, Store: ms, Clock: clk})
	if err != nil {
		b.Fatal(err)
	}
	if linear && !setLinear(g) {
		b.Skip("no route index to turn off")
	}
	hr := httptest.NewRequest("GET", fmt.Sprintf("http://example.com/api/v1/e%d/x", n-2), nil)
	if shape == "hosts" {
		hr = httptest.NewRequest("GET", "http://T1.example.com/api/v1/users", nil)
		hr.Host = fmt.Sprintf("t%d.example.com", n-2)
	}
	hr.RemoteAddr = "192.0.2.1:1234"
	r := &Request{HTTP: hr, Peer: hr.RemoteAddr}
	v := new(Verdict)
	g.Check(r, v)
	if !v.Allowed || len(v.Outcomes) != 2 {
		b.Fatalf("allowed %v, %d outcomes, want 2", v.Allowed, len(v.Outcomes))
	}
	b.ReportAllocs()
	for b.Loop() {
		r.clientSet = false
		g.Check(r, v)
	}
}

// setLinear turns g's route index off, so that it tries every limit, and
// reports whether it had one.
func setLinear(g *Gate) bool {
	had := g.index != nil
	g.index = nil
	return had
}
