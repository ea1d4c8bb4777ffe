package rules

import (
	"strings"
	"sync/atomic"
	"testing"

	"github.com/floodgate/floodgate"
)

// TestElasticWithSpare: with Options.Spare a rate_limit may say
// mode: elastic; its rule carries the ceiling and that very signal.
// Bad combinations are reported at their lines; without Spare the mode
// is refused (errors_test.go).
func TestElasticWithSpare(t *testing.T) {
	var spare atomic.Bool
	opts := Options{Spare: spare.Load}
	d, err := ParseWith("e.yaml", []byte(`domain: e
http:
  - key: [remote_address]
    rate_limit: {unit: minute, requests_per_unit: 2, mode: elastic, elastic_ceiling: 5}
`), opts)
	if err != nil {
		t.Fatal(err)
	}
	r := d.HTTP()[0].Limit.Policy.Rules()[0]
	if r.Mode != floodgate.Elastic || r.ElasticCeiling != 5 || r.Spare == nil || r.Spare() {
		t.Fatalf("rule %+v: want elastic, ceiling 5, the signal (false)", r)
	}
	spare.Store(true)
	if !r.Spare() {
		t.Fatal("the rule's signal is not Options.Spare")
	}
	_, err = ParseWith("e.yaml", []byte(`domain: e
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 2, mode: elastic}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 5, mode: elastic, elastic_ceiling: 5}
  - key: c
    rate_limit: {unit: minute, requests_per_unit: 5, mode: soft, soft_percent: 10, elastic_ceiling: 9}
  - key: d
    rate_limit: {unit: minute, requests_per_unit: 5, mode: elastic, elastic_ceiling: lots}
`), opts)
	for _, want := range []string{
		"e.yaml:4: descriptors[0].rate_limit.mode: elastic needs elastic_ceiling",
		"e.yaml:6: descriptors[1].rate_limit.elastic_ceiling: ",
		"e.yaml:8: descriptors[2].rate_limit.elastic_ceiling: needs mode: elastic",
		"e.yaml:10: descriptors[3].rate_limit.elastic_ceiling: ",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("want an error %q..., got\n%v", want, err)
		}
	}
}
