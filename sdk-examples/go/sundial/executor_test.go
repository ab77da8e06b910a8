package sundial

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/sundial-sched/sundial/sdk-examples/go/gen/sundialv1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

func TestResultOfMapsHandlerReturns(t *testing.T) {
	ref := &pb.RunRef{ScheduleId: "j@1", Attempt: 2, FencingToken: 9, ShardIndex: 1}
	t0, t1 := time.UnixMilli(1000), time.UnixMilli(2000)
	cases := []struct {
		err    error
		status pb.ResultStatus
		code   string
	}{
		{nil, pb.ResultStatus_RESULT_STATUS_SUCCEEDED, ""},
		{&Failure{Code: "boom", Message: "m"}, pb.ResultStatus_RESULT_STATUS_FAILED, "boom"},
		{ErrCancelled, pb.ResultStatus_RESULT_STATUS_CANCELLED, ""},
		{errors.New("plain"), pb.ResultStatus_RESULT_STATUS_FAILED, "error"},
	}
	for _, c := range cases {
		r := resultOf(ref, []byte("out"), c.err, t0, t1)
		if r.Status != c.status || r.ErrorCode != c.code || !proto.Equal(r.Run, ref) ||
			r.StartedAtMs != 1000 || r.FinishedAtMs != 2000 {
			t.Errorf("resultOf(%v) = %v", c.err, r)
		}
	}
	_, err := callHandler(context.Background(), func(context.Context, *Run) ([]byte, error) { panic("bug") }, &Run{})
	var f *Failure
	if !errors.As(err, &f) || f.Code != "panic" {
		t.Errorf("a panicking handler gave %v, want a panic failure", err)
	}
}

func TestJitterStaysWithinHalfToWhole(t *testing.T) {
	for i := 0; i < 1000; i++ {
		if d := jitter(time.Second); d < 500*time.Millisecond || d > time.Second {
			t.Fatalf("jitter(1s) = %v", d)
		}
	}
}

// server is a scripted ExecutorService on a real socket: each stream's messages go to
// a channel, and the test sends what it wants.
type server struct {
	pb.UnimplementedExecutorServiceServer
	streams chan *stream
}

type stream struct {
	in   chan *pb.ExecutorMessage
	send func(*pb.ServerMessage) error
	end  chan struct{}
}

func (s *server) Connect(srv pb.ExecutorService_ConnectServer) error {
	st := &stream{in: make(chan *pb.ExecutorMessage, 100), send: srv.Send, end: make(chan struct{})}
	go func() {
		for {
			m, err := srv.Recv()
			if err != nil {
				close(st.in)
				return
			}
			st.in <- m
		}
	}()
	s.streams <- st
	select {
	case <-st.end:
	case <-srv.Context().Done():
	}
	return nil
}

// next returns the next message that is not a heartbeat.
func (st *stream) next(t *testing.T) *pb.ExecutorMessage {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case m, ok := <-st.in:
			if !ok {
				t.Fatal("the stream ended")
			}
			if m.GetHeartbeat() == nil {
				return m
			}
		case <-timeout:
			t.Fatal("no message within 5 s")
		}
	}
}

// quiet fails if a message other than a heartbeat arrives within d.
func (st *stream) quiet(t *testing.T, d time.Duration, why string) {
	t.Helper()
	deadline := time.After(d)
	for {
		select {
		case m := <-st.in:
			if m.GetHeartbeat() == nil {
				t.Fatalf("%s: got %v", why, m)
			}
		case <-deadline:
			return
		}
	}
}

func TestProtocolGoAheadResultsCancelAndReconnect(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &server{streams: make(chan *stream, 4)}
	g := grpc.NewServer()
	pb.RegisterExecutorServiceServer(g, srv)
	go g.Serve(lis)
	defer g.Stop()

	var started atomic.Int32
	cancelled := make(chan string, 4)
	ex := New(Config{Endpoints: []string{lis.Addr().String()}, Group: "g", NodeID: "n1", ShutdownGrace: time.Second})
	ex.Handle("echo", func(ctx context.Context, run *Run) ([]byte, error) {
		started.Add(1)
		return run.Payload, nil
	})
	ex.Handle("block", func(ctx context.Context, run *Run) ([]byte, error) {
		started.Add(1)
		<-ctx.Done()
		cancelled <- run.ScheduleID
		return nil, ctx.Err()
	})
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- ex.Run(ctx) }()

	welcome := &pb.ServerMessage{Msg: &pb.ServerMessage_Welcome{Welcome: &pb.Welcome{HeartbeatIntervalMs: 50, LeaseTtlMs: 5000}}}
	st := <-srv.streams
	if h := st.next(t).GetHello(); h.GetNodeId() != "n1" || h.GetGroup() != "g" || len(h.GetInFlight()) != 0 {
		t.Fatalf("hello = %v", h)
	}
	st.send(welcome)
	dispatch := func(st *stream, sid, handler string, token uint64) *pb.RunRef {
		ref := &pb.RunRef{ScheduleId: sid, Attempt: 1, FencingToken: token}
		st.send(&pb.ServerMessage{Msg: &pb.ServerMessage_Dispatch{Dispatch: &pb.Dispatch{Run: ref, Handler: handler, Payload: []byte("hi")}}})
		return ref
	}
	goAhead := func(st *stream, ref *pb.RunRef, ok bool) {
		st.send(&pb.ServerMessage{Msg: &pb.ServerMessage_StartAck{StartAck: &pb.StartAck{Run: ref, Go: ok}}})
	}

	// Admitted, Started sent, but nothing runs before go = true.
	a := dispatch(st, "a@1", "echo", 11)
	if m := st.next(t).GetStarted(); !proto.Equal(m.GetRun(), a) {
		t.Fatalf("want Started for a, got %v", m)
	}
	st.quiet(t, 300*time.Millisecond, "before the go-ahead")
	if started.Load() != 0 {
		t.Fatal("a handler started before its go-ahead")
	}
	goAhead(st, a, true)
	res := st.next(t).GetResult()
	if !proto.Equal(res.GetRun(), a) || res.GetStatus() != pb.ResultStatus_RESULT_STATUS_SUCCEEDED || string(res.GetOutput()) != "hi" {
		t.Fatalf("result = %v", res)
	}

	// go = false: forgotten, never started, no Result.
	b := dispatch(st, "b@1", "echo", 12)
	st.next(t) // Started
	goAhead(st, b, false)
	st.quiet(t, 300*time.Millisecond, "after go = false")
	if started.Load() != 1 {
		t.Fatal("a dispatch answered go = false started")
	}

	// An unknown handler is rejected.
	c := dispatch(st, "c@1", "nope", 13)
	if r := st.next(t).GetReject(); !proto.Equal(r.GetRun(), c) {
		t.Fatalf("want a Reject of c, got %v", r)
	}

	// Cancel stops a running handler's context; no Result follows.
	d := dispatch(st, "d@1", "block", 14)
	st.next(t) // Started
	goAhead(st, d, true)
	time.Sleep(100 * time.Millisecond)
	st.send(&pb.ServerMessage{Msg: &pb.ServerMessage_Cancel{Cancel: &pb.Cancel{Run: d, Reason: "test"}}})
	select {
	case sid := <-cancelled:
		if sid != "d@1" {
			t.Fatalf("cancelled %s", sid)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the handler's context was not cancelled")
	}
	st.quiet(t, 300*time.Millisecond, "after a cancel")

	// a's Result was never acknowledged: after the stream breaks, the next Hello lists
	// it and the Result is sent again after the Welcome; the ack settles it.
	close(st.end)
	st2 := <-srv.streams
	hello := st2.next(t).GetHello()
	if len(hello.GetInFlight()) != 1 || !proto.Equal(hello.GetInFlight()[0], a) {
		t.Fatalf("hello.in_flight = %v, want only a", hello.GetInFlight())
	}
	st2.send(welcome)
	if r := st2.next(t).GetResult(); !proto.Equal(r.GetRun(), a) {
		t.Fatalf("want a's Result again, got %v", r)
	}
	st2.send(&pb.ServerMessage{Msg: &pb.ServerMessage_ResultAck{ResultAck: &pb.ResultAck{Run: a, Accepted: true}}})
	deadline := time.After(5 * time.Second)
	for {
		select {
		case m := <-st2.in:
			if hb := m.GetHeartbeat(); hb != nil && len(hb.GetInFlight()) == 0 {
				stop()
				if err := <-done; err != nil {
					t.Fatal(err)
				}
				return
			}
		case <-deadline:
			t.Fatal("heartbeats still list a after its ResultAck")
		}
	}
}
