package loadgen

import (
	"github.com/floodgate/floodgate/service"

	"context"
	"net"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
)

// emptyHandler answers every ShouldRateLimit with OVERALL OK and nothing
// else: no descriptor statuses, no headers, no lookup. It is the ceiling of
// the gRPC stack alone, the baseline that a real handler's cost per decision
// is measured against.
type emptyHandler struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

// one shared response: the handler allocates nothing (gRPC only reads it)
var okResponse = &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}

func (emptyHandler) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return okResponse, nil
}

// EmptyServer starts serving, on lis, a RateLimitService whose
// ShouldRateLimit returns OK immediately and does no work, and returns the
// server; Serve runs in its own goroutine until the caller calls Stop or
// GracefulStop (which also closes lis). The server has the options the real
// service uses (service.GRPCOptions), so the two can be compared request for
// request.
func EmptyServer(lis net.Listener) *grpc.Server {
	return serveHandler(lis, emptyHandler{}, service.GRPCOptions()...)
}

// StockEmptyServer is EmptyServer with grpc-go's default server options
// (grpc.NewServer() with none): the handler as a plain grpc-go service would
// serve it, for a second comparison point beside the tuned stack of
// EmptyServer.
func StockEmptyServer(lis net.Listener) *grpc.Server {
	return serveHandler(lis, emptyHandler{})
}

// serveHandler serves h on lis in a new goroutine.
func serveHandler(lis net.Listener, h rlsv3.RateLimitServiceServer, opts ...grpc.ServerOption) *grpc.Server {
	s := grpc.NewServer(opts...)
	rlsv3.RegisterRateLimitServiceServer(s, h)
	go func() { _ = s.Serve(lis) }()
	return s
}
