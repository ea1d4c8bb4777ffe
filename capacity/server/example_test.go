package server_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/floodgate/floodgate/capacity/capacitypb"
	"github.com/floodgate/floodgate/capacity/server"
)

// A capacity server embedded in a program: open it on a resources file,
// register it on a gRPC server, and clients ask it for leases.
func Example() {
	dir, _ := os.MkdirTemp("", "capacity")
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "resources.yaml")
	os.WriteFile(file, []byte(`resources:
  - id: db
    capacity: 120
    algorithm: fair_share
  - id: "*"
    capacity: 10
`), 0o644)

	srv, err := server.Open(file, server.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	gs := grpc.NewServer()
	srv.Register(gs)
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	go gs.Serve(l)
	defer gs.Stop()

	conn, _ := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer conn.Close()
	resp, err := pb.NewCapacityClient(conn).GetCapacity(context.Background(), &pb.GetCapacityRequest{
		ClientId: "worker-1",
		Resource: []*pb.ResourceRequest{{ResourceId: "db", Wants: 50}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	lease := resp.Response[0].Gets
	fmt.Println("capacity:", lease.Capacity, "refresh every", lease.RefreshInterval.AsDuration())
	// Output: capacity: 50 refresh every 5s
}
