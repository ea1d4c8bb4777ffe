package grpclimit_test

import (
	"os/exec"
	"strings"
	"testing"
)

// The interceptors link grpc, and neither Envoy's types (remote mode's
// client is package gate/remote) nor Redis's client or bbolt.
func TestNoHeavyDependencies(t *testing.T) {
	const pkg = "github.com/floodgate/floodgate/grpclimit"
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{with .Module}}{{.Path}}{{end}}", pkg).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	for line := range strings.Lines(string(out)) {
		path, mod, _ := strings.Cut(strings.TrimSpace(line), " ")
		for _, m := range []string{"github.com/envoyproxy/", "github.com/cncf/", "github.com/redis/rueidis", "go.etcd.io/bbolt", "go.opentelemetry.io/otel/sdk"} {
			if strings.HasPrefix(mod, m) {
				t.Errorf("%s depends on %s", pkg, path)
			}
		}
	}
}
