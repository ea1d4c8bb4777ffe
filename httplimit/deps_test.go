package httplimit_test

import (
	"os/exec"
	"strings"
	"testing"
)

// The middleware for net/http links neither grpc nor Envoy's types (remote
// mode's client is package gate/remote), nor Redis's client or bbolt: a
// plain net/http user compiles no more than the gate needs (tracing links
// OpenTelemetry's API, never its SDK: the application chooses that).
func TestNoHeavyDependencies(t *testing.T) {
	for _, pkg := range []string{"github.com/floodgate/floodgate/httplimit", "github.com/floodgate/floodgate/gate"} {
		for _, bad := range heavyDeps(t, pkg) {
			t.Errorf("%s depends on %s", pkg, bad)
		}
	}
}

// heavyDeps lists the packages pkg depends on from the modules a
// net/http user should not compile.
func heavyDeps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{with .Module}}{{.Path}}{{end}}", pkg).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	var bad []string
	for line := range strings.Lines(string(out)) {
		path, mod, _ := strings.Cut(strings.TrimSpace(line), " ")
		for _, m := range []string{"google.golang.org/grpc", "google.golang.org/protobuf", "github.com/envoyproxy/", "github.com/cncf/", "github.com/redis/rueidis", "go.etcd.io/bbolt", "go.opentelemetry.io/otel/sdk"} {
			if strings.HasPrefix(mod, m) {
				bad = append(bad, path)
			}
		}
	}
	return bad
}
