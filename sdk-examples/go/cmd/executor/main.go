// Command executor is a Sundial executor in Go: the protocol lives in package sundial,
// this file only registers handlers. Handlers: echo (the payload back as output),
// sleep (payload = milliseconds; stops when the run is cancelled) and fail (fails with
// error code "go_fail").
//
//	go run ./cmd/executor --endpoints localhost:50051 --group demo
//
// SIGTERM or SIGINT: take no new work, let running handlers finish (10 s at most),
// then exit 0.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sundial-sched/sundial/sdk-examples/go/sundial"
)

func main() {
	endpoints := flag.String("endpoints", "localhost:50051", "comma-separated host:port of Sundial servers (plaintext)")
	group := flag.String("group", "demo", "the group jobs target")
	nodeID := flag.String("node-id", "", "this process's node id (default: host name + pid)")
	window := flag.Uint("max-concurrency", 0, "runs held at once (0 = the server's default window, 64)")
	flag.Parse()

	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ex := sundial.New(sundial.Config{
		Endpoints:      strings.Split(*endpoints, ","),
		Group:          *group,
		NodeID:         *nodeID,
		Token:          os.Getenv("SUNDIAL_EXECUTOR_TOKEN"),
		MaxConcurrency: uint32(*window),
		Logger:         log,
		OnWelcome: func(instance string) {
			fmt.Printf("GO_EXECUTOR_READY %s\n", *nodeID)
		},
	})
	ex.Handle("echo", func(ctx context.Context, run *sundial.Run) ([]byte, error) {
		return run.Payload, nil
	})
	ex.Handle("sleep", func(ctx context.Context, run *sundial.Run) ([]byte, error) {
		ms, err := strconv.Atoi(strings.TrimSpace(string(run.Payload)))
		if err != nil {
			return nil, &sundial.Failure{Code: "bad_payload", Message: "sleep wants milliseconds: " + err.Error()}
		}
		log.Info("sleep started", "schedule_id", run.ScheduleID, "attempt", run.Attempt, "ms", ms)
		select {
		case <-time.After(time.Duration(ms) * time.Millisecond):
			return []byte(fmt.Sprintf("slept %d ms", ms)), nil
		case <-ctx.Done():
			log.Info("sleep cancelled", "schedule_id", run.ScheduleID, "attempt", run.Attempt, "why", ctx.Err())
			return nil, ctx.Err()
		}
	})
	ex.Handle("fail", func(ctx context.Context, run *sundial.Run) ([]byte, error) {
		return nil, &sundial.Failure{Code: "go_fail", Message: "fail always fails"}
	})

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := ex.Run(ctx); err != nil {
		log.Error("executor stopped", "err", err)
		os.Exit(1)
	}
}
