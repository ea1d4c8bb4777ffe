package server_test

import (
	"fmt"
	"net"

	"google.golang.org/grpc"

	"github.com/floodgate/floodgate/capacity/server"
	"github.com/floodgate/floodgate/internal/lease"
)

// Serving Envoy's RLQS beside the Capacity service, on one table: Envoys
// and lease clients share the same capacities.
func ExampleRegisterRLQS() {
	cfg, err := lease.ParseConfig("resources.yaml", []byte(`resources:
  - id: edge/name=search
    capacity: 200
    algorithm: fair_share
  - id: "*"
    capacity: 10
    algorithm: fair_share
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	srv := server.New(cfg, server.Options{})
	gs := grpc.NewServer()
	srv.Register(gs)
	rlqs := server.RegisterRLQS(gs, srv, server.RLQSOptions{})
	defer rlqs.Close()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		return
	}
	go gs.Serve(lis)
	defer gs.Stop()
	fmt.Println("streams:", rlqs.Streams())
	// Output: streams: 0
}

// The resource id of Envoy's bucket {name: search, env: prod} in domain
// edge, as the resources file names it.
func ExampleBucketResource() {
	fmt.Println(server.BucketResource("edge", map[string]string{"name": "search", "env": "prod"}))
	fmt.Println(server.BucketResource("edge", map[string]string{"path": "/v1/search"}))
	// Output:
	// edge/env=prod,name=search
	// edge/path=%2Fv1%2Fsearch
}

// A share of 33.3 requests per second, as the token bucket Envoy enforces:
// rounded down to whole tokens per fill interval.
func ExampleTokenBucket() {
	tb := server.TokenBucket(33.3, 1)
	fmt.Println(tb.GetMaxTokens(), tb.GetTokensPerFill().GetValue(), tb.GetFillInterval().AsDuration(), server.TokenRate(tb))
	tb = server.TokenBucket(0.25, 1)
	fmt.Println(tb.GetMaxTokens(), tb.GetTokensPerFill().GetValue(), tb.GetFillInterval().AsDuration(), server.TokenRate(tb))
	// Output:
	// 33 33 1s 33
	// 1 1 4s 0.25
}
