package proxy

import "testing"

// The gate runs in the server's HeaderReceived hook only where fasthttp
// hands it the header of the handler's RequestCtx; this fasthttp does.
func TestHeaderCtx(t *testing.T) {
	if !headerCtxWorks() {
		t.Fatal("HeaderReceived's header is not its RequestCtx's: the gate would wait for the first 8 KiB of each body")
	}
}
