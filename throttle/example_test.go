package throttle_test

import (
	"context"
	"fmt"
	"net/http"

	"github.com/floodgate/floodgate/throttle"
)

// A handler that calls another service passes its request's criticality
// on: the Transport sets the header from the context.
func ExampleTransport() {
	client := &http.Client{Transport: &throttle.Transport{}}
	ctx := throttle.WithCriticality(context.Background(), throttle.SheddablePlus)
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://backend.internal/x", nil)
	_ = req // client.Do(req) sends X-Criticality: SHEDDABLE_PLUS
	_ = client
	c, _ := throttle.FromContext(ctx)
	fmt.Println(c)
	// Output: SHEDDABLE_PLUS
}

func ExampleParseCriticality() {
	for _, v := range []string{"critical_plus", "prefetch"} {
		c, ok := throttle.ParseCriticality(v)
		fmt.Println(c, ok)
	}
	// Output:
	// CRITICAL_PLUS true
	// CRITICAL false
}
