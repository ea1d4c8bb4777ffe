// Package capacitypb holds the generated Go code of Floodgate's capacity
// lease protocol, proto/floodgate/capacity/v1/capacity.proto. Do not edit
// it: change the .proto and run scripts/genproto.sh.
package capacitypb
