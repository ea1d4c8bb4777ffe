module github.com/floodgate/floodgate/bench

go 1.26.0

require (
	github.com/floodgate/floodgate v0.0.0
	github.com/sethvargo/go-limiter v0.7.1
	github.com/ulule/limiter/v3 v3.11.2
	golang.org/x/time v0.16.0
)

require (
	github.com/dchest/siphash v1.2.3 // indirect
	github.com/pkg/errors v0.9.1 // indirect
)

replace github.com/floodgate/floodgate => ../
