package adaptive_test

import (
	"fmt"
	"net/http"

	"google.golang.org/grpc"

	"github.com/floodgate/floodgate/adaptive"
)

func ExampleTransport() {
	th, err := adaptive.New(adaptive.Options{}) // K = 2, a 2-minute window, retries ≤ 10% + 10
	if err != nil {
		panic(err)
	}
	client := &http.Client{Transport: &adaptive.Transport{Throttle: th, Retries: 2}}
	_ = client // client.Get(...) fails with an error wrapping adaptive.ErrThrottled when dropped locally
	fmt.Println(th.DropProbability("api.example.com"))
	// Output: 0
}

func ExampleUnaryClientInterceptor() {
	th, err := adaptive.New(adaptive.Options{K: 2})
	if err != nil {
		panic(err)
	}
	opt := grpc.WithUnaryInterceptor(adaptive.UnaryClientInterceptor(th, adaptive.GRPCOptions{Retries: 1}))
	_ = opt // grpc.NewClient(target, creds, opt)
}
