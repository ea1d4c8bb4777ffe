package adaptive

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// GRPCOptions configure UnaryClientInterceptor.
type GRPCOptions struct {
	// Target names a call's backend; nil means the connection's target.
	Target func(cc *grpc.ClientConn, method string) string
	// Refused tells an overload refusal; nil means UNAVAILABLE or
	// RESOURCE_EXHAUSTED.
	Refused func(error) bool
	// Retries is the most retries of one refused call (each taken from
	// the retry budget and throttled as any call); 0: none.
	Retries int
}

// RefusedGRPC is the default GRPCOptions.Refused: UNAVAILABLE or
// RESOURCE_EXHAUSTED.
func RefusedGRPC(err error) bool {
	c := status.Code(err)
	return c == codes.Unavailable || c == codes.ResourceExhausted
}

// UnaryClientInterceptor throttles unary calls adaptively per target with
// t; a call dropped locally fails with UNAVAILABLE ("adaptive: request
// dropped locally ..."), and refused calls are retried within o.Retries
// and the retry budget.
func UnaryClientInterceptor(t *Throttle, o GRPCOptions) grpc.UnaryClientInterceptor {
	refused := o.Refused
	if refused == nil {
		refused = RefusedGRPC
	}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		target := cc.Target()
		if o.Target != nil {
			target = o.Target(cc, method)
		}
		for attempt := 0; ; attempt++ {
			if !t.Admit(target, attempt > 0) {
				return status.Error(codes.Unavailable, ErrThrottled.Error())
			}
			err := invoker(ctx, method, req, reply, cc, opts...)
			bad := refused(err)
			t.Done(target, !bad)
			if !bad || attempt >= o.Retries || ctx.Err() != nil || !t.AllowRetry(target) {
				return err
			}
		}
	}
}

// StreamClientInterceptor throttles the opening of streams adaptively
// per target with t: a stream dropped locally fails to open with
// UNAVAILABLE. A stream counts as accepted unless its first message (or
// its end, if it has none) is a refusal; streams are not retried.
func StreamClientInterceptor(t *Throttle, o GRPCOptions) grpc.StreamClientInterceptor {
	refused := o.Refused
	if refused == nil {
		refused = RefusedGRPC
	}
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		target := cc.Target()
		if o.Target != nil {
			target = o.Target(cc, method)
		}
		if !t.Admit(target, false) {
			return nil, status.Error(codes.Unavailable, ErrThrottled.Error())
		}
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			t.Done(target, !refused(err))
			return nil, err
		}
		return &judgedStream{ClientStream: cs, judge: func(err error) { t.Done(target, !refused(err)) }}, nil
	}
}

// judgedStream reports the outcome of its first RecvMsg: the first sign
// of whether the backend took the stream.
type judgedStream struct {
	grpc.ClientStream
	judge  func(error)
	judged bool
}

func (s *judgedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if !s.judged {
		s.judged = true
		s.judge(err)
	}
	return err
}
