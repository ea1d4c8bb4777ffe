// Package downstore is a floodgate.Store that cannot be reached: every call
// fails with Err. Tests of the middleware use it for the error path of a
// store that is down, where pausing a real Redis would only add time.
package downstore

import (
	"context"
	"errors"

	"github.com/floodgate/floodgate"
)

// Err is the error of every call.
var Err = errors.New("store down")

// Store fails every call with Err.
type Store struct{}

// Do fails with Err.
func (Store) Do(context.Context, int64, floodgate.Op) (floodgate.Decision, error) {
	return floodgate.Decision{}, Err
}

// DoBatch fails with Err.
func (Store) DoBatch(context.Context, int64, []floodgate.Op, []floodgate.Decision) error {
	return Err
}
