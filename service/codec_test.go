package service_test

import (
	"bytes"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/floodgate/floodgate/service"
)

// rawCodec sends a request's bytes as they are (a []byte), so a test can
// send what protobuf-go would refuse to marshal, as Envoy (C++) may.
type rawCodec struct{ encoding.CodecV2 }

func (c rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if b, ok := v.([]byte); ok {
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	return c.CodecV2.Marshal(v)
}

// A descriptor value that is not valid UTF-8 (a client's header with bytes
// 0x80-0xFF, which Envoy copies as they are) is limited like any other,
// each distinct value on its own; protobuf-go's decoder alone refuses the
// request, and Envoy lets a request whose call failed through every limit.
func TestInvalidUTF8ValueIsLimited(t *testing.T) {
	e := newEnv(t, service.Options{}, diffRules)
	conn := dialGRPC(t, e.serveGRPC(t))

	// a valid request, then its value's bytes swapped for invalid ones
	wire := func(value string) []byte {
		b, err := proto.Marshal(one("t", 0, d("user", "PLACEHOLDER")))
		if err != nil {
			t.Fatal(err)
		}
		return bytes.Replace(b, []byte("PLACEHOLDER"), []byte(value), 1)
	}
	ask := func(value string) *rlsv3.RateLimitResponse {
		t.Helper()
		var resp rlsv3.RateLimitResponse
		err := conn.Invoke(t.Context(), "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", wire(value), &resp,
			grpc.ForceCodecV2(rawCodec{encoding.GetCodecV2(grpcproto.Name)}))
		if err != nil {
			t.Fatalf("value %q: %v", value, err)
		}
		return &resp
	}
	bad, other := "\xff\xfeKEY-00001", "\xfe\xffKEY-00001" // as long as PLACEHOLDER
	for i := 1; i <= 6; i++ {
		want := rlsv3.RateLimitResponse_OK
		if i == 6 {
			want = rlsv3.RateLimitResponse_OVER_LIMIT // 5 a minute
		}
		if r := ask(bad); r.OverallCode != want {
			t.Fatalf("request %d with an invalid UTF-8 value: %v, want %v", i, r, want)
		}
	}
	if r := ask(other); r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 4 {
		t.Fatalf("another invalid value: %v, want a limit of its own", r)
	}
	// and a valid request still decodes as before
	if r := ask("valid-value"); r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 4 {
		t.Fatalf("a valid value: %v", r)
	}
}
