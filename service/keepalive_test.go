package service_test

import (
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"

	"github.com/floodgate/floodgate/service"
)

// A client that pings an idle connection every second or so (Envoy's
// connection_keepalive, a grpc-go client with keepalive) keeps it: the
// server answers each ping and sends no GOAWAY. On grpc-go's default
// policy (a ping in five minutes at most, none without calls in flight)
// the fourth ping here is answered, then GOAWAY too_many_pings.
func TestKeepalivePingsAccepted(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(service.GRPCOptions()...)
	go g.Serve(lis) //nolint:errcheck // ends with Stop
	defer g.Stop()

	c, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	const pings = 5
	for i := range pings {
		if i > 0 {
			time.Sleep(1100 * time.Millisecond) // just over the policy's second
		}
		data := [8]byte{byte(i + 1)}
		if err := fr.WritePing(false, data); err != nil {
			t.Fatalf("ping %d: %v", i+1, err)
		}
		// read until this ping's ack; a GOAWAY fails the test
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		for acked := false; !acked; {
			f, err := fr.ReadFrame()
			if err != nil {
				t.Fatalf("ping %d: %v", i+1, err)
			}
			switch f := f.(type) {
			case *http2.GoAwayFrame:
				t.Fatalf("ping %d: GOAWAY %v %q", i+1, f.ErrCode, f.DebugData())
			case *http2.SettingsFrame:
				if !f.IsAck() {
					fr.WriteSettingsAck() //nolint:errcheck // a failed write shows in the next read
				}
			case *http2.PingFrame:
				acked = f.IsAck() && f.Data == data
			}
		}
	}
	// nothing follows the last ack (a GOAWAY would come right after it)
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if f, err := fr.ReadFrame(); err == nil {
		if g, ok := f.(*http2.GoAwayFrame); ok {
			t.Fatalf("after the pings: GOAWAY %v %q", g.ErrCode, g.DebugData())
		}
	} else if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("after the pings: %v", err)
	}
}
