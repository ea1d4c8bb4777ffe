package service

import (
	"testing"
	"unicode/utf8"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// FuzzEscapeStrings: whatever the bytes, escapeStrings does not panic, and
// what it returns, when it decodes, has valid strings. (A request that
// decodes but for invalid UTF-8 decodes once escaped:
// TestInvalidUTF8ValueIsLimited.)
func FuzzEscapeStrings(f *testing.F) {
	req := &rlsv3.RateLimitRequest{Domain: "d", HitsAddend: 3, Descriptors: []*rlcommon.RateLimitDescriptor{{
		Entries:    []*rlcommon.RateLimitDescriptor_Entry{{Key: "k", Value: "vvvv"}, {Key: "k2", Value: "v2"}},
		HitsAddend: wrapperspb.UInt64(7),
	}}}
	b, err := proto.Marshal(req)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte("\x0a\x02\xff\xfe"))
	f.Add([]byte("\x12\x06\x0a\x04\x12\x02\xff\xff"))
	f.Add([]byte("\x12\xff\xff\xff\xff\x0f"))
	f.Fuzz(func(t *testing.T, b []byte) {
		out, err := escapeStrings(nil, b, (&rlsv3.RateLimitRequest{}).ProtoReflect().Descriptor(), 0)
		if err != nil {
			return
		}
		var got rlsv3.RateLimitRequest
		if err := proto.Unmarshal(out, &got); err != nil {
			return // malformed otherwise: the codec reports the error
		}
		if got.Domain != "" && !utf8.ValidString(got.Domain) {
			t.Fatalf("domain %q is still not UTF-8", got.Domain)
		}
		for _, d := range got.Descriptors {
			for _, e := range d.Entries {
				if !utf8.ValidString(e.Key) || !utf8.ValidString(e.Value) {
					t.Fatalf("entry %q=%q is still not UTF-8", e.Key, e.Value)
				}
			}
		}
	})
}
