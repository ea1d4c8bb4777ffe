package gate

import "errors"

// KeyFunc returns a function that computes, for a request, the key the
// parts name, as a limit of this gate keyed by them counts it: the
// parts' values joined with '|', each bounded and escaped, the client
// address resolved through the gate's trusted proxies. ok is false when a
// part is absent and its fallback (Or(MissingSkip)) skips the limit. For
// the callers that key something else by the gate's rules (an in-flight
// cap: httplimit.InFlightOptions.Key).
func (g *Gate) KeyFunc(parts ...Part) (func(r *Request) (key string, ok bool), error) {
	if len(parts) == 0 {
		return nil, errors.New("gate: KeyFunc: no parts")
	}
	cps := make([]compiledPart, len(parts))
	for i, p := range parts {
		cps[i] = compilePart(p)
	}
	return func(r *Request) (string, bool) {
		var kb [128]byte
		key, ok := kb[:0], true
		for i := range cps {
			if i > 0 {
				key = append(key, '|')
			}
			if key, ok = g.value(r, &cps[i], key, false); !ok {
				return "", false
			}
		}
		return string(key), true
	}, nil
}
