package etcdtest

import (
	"net/http"
	"testing"
)

// TestStartAndKill starts a real etcd, sees it healthy, kills it and sees
// it gone: the harness leaves no server behind.
func TestStartAndKill(t *testing.T) {
	s := Start(t)
	resp, err := http.Get(s.ClientURL + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	s.Kill()
	if _, err := http.Get(s.ClientURL + "/health"); err == nil {
		t.Fatal("etcd still answers after Kill")
	}
}
