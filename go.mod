module github.com/floodgate/floodgate

go 1.26

require github.com/dchest/siphash v1.2.3
