package throttle

import (
	"strings"
	"testing"

	"google.golang.org/grpc/metadata"
)

// FromValues reads gRPC metadata as it reads a header (package throttle
// itself links no grpc: the caller passes md.Get(key)).
func TestFromGRPCMetadata(t *testing.T) {
	md := metadata.Pairs(strings.ToLower(DefaultHeader), "sheddable_plus")
	if c := FromValues(md.Get(DefaultHeader), Critical); c != SheddablePlus {
		t.Fatalf("got %v", c)
	}
	if c := FromValues(metadata.MD{}.Get(DefaultHeader), Critical); c != Critical {
		t.Fatalf("no metadata: %v", c)
	}
}
