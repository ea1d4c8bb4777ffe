package grpclimit_test

import (
	"time"

	"google.golang.org/grpc"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/grpclimit"
)

// Limit each caller (by its x-api-key metadata, else its address) to 50
// calls a second on one expensive method, and delay rather than refuse
// short bursts on every method.
func Example() {
	search := floodgate.MustPolicy("search", floodgate.Rule{Algorithm: floodgate.GCRA, Limit: 50, Period: time.Second, Burst: 10})
	all := floodgate.MustPolicy("all", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 500, Period: time.Second, Burst: 100})
	lim, err := grpclimit.New(grpclimit.Options{Config: gate.Config{Limits: []gate.Limit{
		{Name: "search", Policy: search, Match: gate.Match{Path: "/shop.Catalog/Search"}, Key: []gate.Part{gate.Header("x-api-key")}},
		{Name: "all", Policy: all, Key: []gate.Part{gate.IP()}, Action: gate.Delay, MaxDelay: 200 * time.Millisecond},
	}}})
	if err != nil {
		panic(err)
	}
	defer lim.Close()
	srv := grpc.NewServer(grpc.UnaryInterceptor(lim.Unary()), grpc.StreamInterceptor(lim.Stream()))
	_ = srv // register services, then srv.Serve(listener)
}
