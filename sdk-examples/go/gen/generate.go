// Package gen holds the Go stubs generated from proto/ (package sundialv1), never
// checked in: `go generate ./...` in sdk-examples/go writes them (it needs protoc and
// the protoc-gen-go and protoc-gen-go-grpc plugins on PATH; see the README).
package gen

//go:generate protoc --proto_path=../../../proto --go_out=.. --go_opt=module=github.com/sundial-sched/sundial/sdk-examples/go --go-grpc_out=.. --go-grpc_opt=module=github.com/sundial-sched/sundial/sdk-examples/go sundial/v1/executor.proto sundial/v1/job.proto sundial/v1/run.proto sundial/v1/admin.proto
