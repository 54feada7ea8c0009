// Package echopb holds the generated code of echo.proto.
//
// Regenerate (protoc 3.21 from Debian's protobuf-compiler; the plugins from the Go proxy):
//
//	go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
//	go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
//	go generate ./examples/grpc-over-rdma/echopb
package echopb

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative echo.proto
