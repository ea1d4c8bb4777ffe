package rules

import (
	"strings"
	"testing"
)

// A delay route whose own limit is windows only is refused where the
// action is: windows never delay, so it would refuse every request it
// meant to delay. A bucket, or a bucket beside a window, is taken.
func TestDelayRouteNeedsABucket(t *testing.T) {
	src := func(rl string) string {
		return `domain: d
http:
  - name: slow
    key: [remote_address]
    action: delay
    max_delay: 500ms
` + rl
	}
	for _, bad := range []string{
		"    rate_limit: {unit: second, requests_per_unit: 5, algorithm: fixed_window}\n",
		"    rate_limit: {unit: second, requests_per_unit: 5}\n", // envoyproxy/ratelimit's fixed window
		"    rate_limit: {unit: second, requests_per_unit: 5, algorithm: sliding_window}\n",
	} {
		_, err := Parse("d.yaml", []byte(src(bad)))
		if err == nil || !strings.Contains(err.Error(), "d.yaml:5") || !strings.Contains(err.Error(), "bucket") {
			t.Errorf("a delay route on %s: %v", bad, err)
		}
	}
	for _, ok := range []string{
		"    rate_limit: {unit: second, requests_per_unit: 5, algorithm: token_bucket, burst: 10}\n",
		"    rate_limit: {unit: second, requests_per_unit: 5, algorithm: gcra}\n",
		"    rate_limits:\n      - {unit: second, requests_per_unit: 5, algorithm: token_bucket}\n      - {unit: hour, requests_per_unit: 500, algorithm: fixed_window}\n",
	} {
		if _, err := Parse("d.yaml", []byte(src(ok))); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
}
