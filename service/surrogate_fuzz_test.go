package service

import (
	"encoding/json"
	"reflect"
	"testing"
)

// replaceLoneSurrogates changes only what encoding/json reads as U+FFFD
// anyway: any valid JSON text decodes to the same value before and after,
// and stays valid.
func FuzzReplaceLoneSurrogates(f *testing.F) {
	for _, s := range []string{`"a\ud800b"`, `{"k":"\udfff","x":["\ud83d\ude00","\\ud800"]}`, `"\"\ud800"`, `"\u00e9\ud800\ud800\udc00"`, `[1,"\ud800`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		out, _ := replaceLoneSurrogates(b)
		if !json.Valid(b) {
			return
		}
		if !json.Valid(out) {
			t.Fatalf("%q became invalid: %q", b, out)
		}
		var x, y any
		json.Unmarshal(b, &x)
		json.Unmarshal(out, &y)
		if !reflect.DeepEqual(x, y) {
			t.Fatalf("%q read %#v, and after %q %#v", b, x, out, y)
		}
	})
}
