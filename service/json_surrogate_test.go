package service_test

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/floodgate/floodgate/service"
)

// A /json value with a lone UTF-16 surrogate escape (JavaScript's
// JSON.stringify writes "\ud800" for a broken string) is limited with
// U+FFFD in its place, as encoding/json reads it and as a gRPC client's
// UTF-8 encoder sends it: protojson refused the request, and a client
// failing open let it through every limit. Pairs, other escapes and text
// outside strings are read as before.
func TestJSONLoneSurrogateIsLimited(t *testing.T) {
	e := newEnv(t, service.Options{}, diffRules)
	srv := httptest.NewServer(e.svc.HTTPHandler(nil, nil))
	t.Cleanup(srv.Close)
	body := func(value string) []byte {
		return []byte(`{"domain":"t","descriptors":[{"entries":[{"key":"user","value":"` + value + `"}]}]}`)
	}
	remaining := func(value string, want string) {
		t.Helper()
		code, b := jsonCall(t, srv.URL, "POST", body(value))
		if code != 200 || !strings.Contains(b, `"limitRemaining":`+want) {
			t.Fatalf("value %s: %d %s, want 200 with %s remaining", value, code, b, want)
		}
	}
	remaining(`a\ud800b`, "4")
	remaining(`a\uDFFFb`, "3")       // a lone low half: the same U+FFFD
	remaining(`a\ufffdb`, "2")       // U+FFFD itself: the same key
	remaining(`a\ud83d\ude00b`, "4") // a pair (an emoji) is its own value
	remaining(`a\\ud800b`, "4")      // an escaped backslash: no escape at all
	remaining(`\"\ud800`, "4")       // after an escaped quote, still in the string
}
