package redistest_test

import (
	"strings"
	"testing"

	"github.com/floodgate/floodgate/internal/redistest"
)

func TestHarness(t *testing.T) {
	s := redistest.Standalone(t)
	if out, err := redistest.Cmd(s.Addr, "SET", "a", "1"); err != nil || out != "OK" {
		t.Fatalf("SET: %q %v", out, err)
	}
	c := redistest.Cluster(t, 3)
	if out, _ := redistest.Cmd(c.Addrs()[0], "CLUSTER", "INFO"); !strings.Contains(out, "cluster_known_nodes:3") {
		t.Fatalf("cluster: %s", out)
	}
	set := redistest.Sentinel(t)
	if out, _ := redistest.Cmd(set.Sentinel.Addr, "SENTINEL", "get-master-addr-by-name", set.Name); !strings.Contains(out, set.Master.Addr[len("127.0.0.1:"):]) {
		t.Fatalf("sentinel master: %q", out)
	}
}
