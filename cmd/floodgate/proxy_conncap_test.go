package main

import (
	"io"
	"strings"
	"testing"
)

func TestMaxConnsPerIPFlag(t *testing.T) {
	c, err := proxyFlags([]string{"--upstream", "http://127.0.0.1:1", "--max-conns-per-ip", "64"}, io.Discard)
	if err != nil || c.connCap.maxConnsPerIP != 64 {
		t.Fatalf("--max-conns-per-ip 64: %v, %+v", err, c)
	}
	c, err = proxyFlags([]string{"--upstream", "http://127.0.0.1:1"}, io.Discard)
	if err != nil || c.connCap.maxConnsPerIP != 0 {
		t.Fatalf("default: %v; want no cap", err)
	}
	t.Setenv("FLOODGATE_MAX_CONNS_PER_IP", "8")
	if c, err = proxyFlags([]string{"--upstream", "http://127.0.0.1:1"}, io.Discard); err != nil || c.connCap.maxConnsPerIP != 8 {
		t.Fatalf("FLOODGATE_MAX_CONNS_PER_IP=8: %v", err)
	}
	_, err = proxyFlags([]string{"--upstream", "http://127.0.0.1:1", "--max-conns-per-ip", "-1"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--max-conns-per-ip -1") {
		t.Fatalf("-1: %v; want an error naming the flag", err)
	}
}
