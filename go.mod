module github.com/floodgate/floodgate

go 1.26

require (
	github.com/dchest/siphash v1.2.3
	github.com/redis/rueidis v1.0.79
)

require golang.org/x/sys v0.47.0 // indirect
