// Package sundial is a Sundial executor in one package: it owns the whole protocol of
// proto/sundial/v1/executor.proto (read its comments for the why of each rule), so a
// program that copies it writes only handlers:
//
//	ex := sundial.New(sundial.Config{Endpoints: []string{"localhost:50051"}, Group: "demo"})
//	ex.Handle("echo", func(ctx context.Context, run *sundial.Run) ([]byte, error) {
//		return run.Payload, nil
//	})
//	err := ex.Run(ctx) // until ctx is done, then drains
//
// What it does for the handlers:
//   - Hello with the token, the window (max_concurrency) and the runs still held from
//     the previous stream; Welcome's unknown_in_flight cancels those handlers.
//   - Credits: it admits a Dispatch only while fewer than the window are admitted or
//     executing (the server sends no more than that; one beyond it is rejected "busy").
//   - The go-ahead: on admission it sends Started and starts the handler only on
//     StartAck go = true; go = false forgets the dispatch. A dispatch cancelled before
//     its go-ahead, or left without one when a stream broke, is rejected so the server
//     routes it again without spending an attempt.
//   - Heartbeats every Welcome.heartbeat_interval_ms listing exactly the held runs
//     (admitted, executing, and those whose Result is not acknowledged yet).
//   - A Result echoing the dispatch's RunRef, kept and resent after every Welcome until
//     its ResultAck.
//   - Cancel, a lease that a HeartbeatAck reports gone, or a lease not renewed for
//     Welcome.lease_ttl_ms on this process's clock (the server unreachable) cancel the
//     handler's context; no Result is sent for it.
//   - Reject for an unknown handler and while draining; Drain stops admitting work,
//     Undrain admits it again.
//   - GoAway and broken streams: reconnect with jittered exponential backoff, across
//     the configured endpoints and those a GoAway names.
//   - When Run's context ends: heartbeats say not_ready, no new work is admitted,
//     running handlers get Config.ShutdownGrace to finish and deliver their Results,
//     then the rest are cancelled and the stream is closed.
package sundial

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"time"

	pb "github.com/sundial-sched/sundial/sdk-examples/go/gen/sundialv1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// DefaultWindow is what the server applies to max_concurrency 0.
const DefaultWindow = 64

// SDK names this package in Hello.sdk.
const SDK = "sundial-example-go/0.1"

// Run is one dispatch as a handler sees it.
type Run struct {
	ScheduleID  string
	JobID       string
	Attempt     uint32
	ShardIndex  uint32
	ShardTotal  uint32
	Payload     []byte
	RouteKey    string
	Labels      map[string]string
	ScheduledAt time.Time
}

// Handler runs one dispatch. Its output is given to GetRun and the webhook. Return a
// *Failure to fail with an error code, ErrCancelled to end the run CANCELLED, any
// other error to fail with code "error". ctx is cancelled when the run is cancelled,
// its lease is lost or its deadline passes: return promptly then.
type Handler func(ctx context.Context, run *Run) ([]byte, error)

// Failure fails a run with a machine-readable code and a message for people.
type Failure struct {
	Code    string
	Message string
}

func (f *Failure) Error() string { return f.Code + ": " + f.Message }

// ErrCancelled, returned by a handler, ends its run CANCELLED (final, not retried).
var ErrCancelled = errors.New("cancelled by the handler")

// Config says where to connect and as whom.
type Config struct {
	// gRPC endpoints, "host:port" (plaintext); tried in turn on every reconnect.
	Endpoints []string
	// Required: the group jobs target.
	Group string
	// [A-Za-z0-9._-]{1,128}; default: host name + "-" + pid.
	NodeID string
	// The group's executor token, if the server requires one.
	Token string
	// The window: runs held at once; 0 = DefaultWindow.
	MaxConcurrency uint32
	// Shown by ListNodes.
	Labels map[string]string
	// How long running handlers may take to finish when Run's context ends; default 10 s.
	ShutdownGrace time.Duration
	// Default: slog.Default().
	Logger *slog.Logger
	// Called after each Welcome (e.g. to print a readiness line); may be nil.
	OnWelcome func(serverInstance string)
}

// key identifies a dispatch: the whole RunRef, as the proto asks.
type key struct {
	scheduleID string
	attempt    uint32
	token      uint64
	shard      uint32
}

func keyOf(r *pb.RunRef) key {
	return key{r.GetScheduleId(), r.GetAttempt(), r.GetFencingToken(), r.GetShardIndex()}
}

func (k key) ref() *pb.RunRef {
	return &pb.RunRef{ScheduleId: k.scheduleID, Attempt: k.attempt, FencingToken: k.token, ShardIndex: k.shard}
}

type phase int

const (
	admitted    phase = iota // Started sent, waiting for the StartAck
	executing                // the handler runs
	awaitingAck              // the Result is sent, waiting for its ResultAck
)

// held is one run this process holds a lease for.
type held struct {
	phase     phase
	dispatch  *pb.Dispatch
	handler   Handler
	cancelled bool               // by Cancel, a lost lease or shutdown
	cancel    context.CancelFunc // executing: cancels the handler's context
	result    *pb.Result         // awaitingAck
	renewed   time.Time          // the last renewal (admission counts as one)
}

// Executor connects to Sundial and runs the registered handlers. Make it with New.
type Executor struct {
	cfg      Config
	log      *slog.Logger
	handlers map[string]Handler

	mu        sync.Mutex
	runs      map[key]*held
	toReject  []key   // left unstarted when a stream broke
	out       *outbox // the current stream's sends; nil while offline
	leaseTTL  time.Duration
	draining  bool
	stopping  bool
	goAwayTo  []string // endpoints a GoAway named
	handlerWG sync.WaitGroup
}

// New makes an executor; register handlers with Handle before Run.
func New(cfg Config) *Executor {
	if cfg.NodeID == "" {
		host, _ := os.Hostname()
		cfg.NodeID = sanitize(fmt.Sprintf("%s-%d", host, os.Getpid()))
	}
	if cfg.ShutdownGrace == 0 {
		cfg.ShutdownGrace = 10 * time.Second
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Executor{
		cfg:      cfg,
		log:      log.With("node_id", cfg.NodeID),
		handlers: map[string]Handler{},
		runs:     map[key]*held{},
		leaseTTL: 30 * time.Second,
	}
}

// Handle registers a handler under a name that jobs give as executor.handler.
func (e *Executor) Handle(name string, h Handler) { e.handlers[name] = h }

// NodeID is the id this executor connects as.
func (e *Executor) NodeID() string { return e.cfg.NodeID }

func (e *Executor) window() int {
	if e.cfg.MaxConcurrency == 0 {
		return DefaultWindow
	}
	return int(e.cfg.MaxConcurrency)
}

// Run connects and serves until ctx is done, then drains (see the package doc). It
// returns nil after a drain, or an error when the configuration is unusable.
func (e *Executor) Run(ctx context.Context) error {
	if len(e.cfg.Endpoints) == 0 || e.cfg.Group == "" || len(e.handlers) == 0 {
		return errors.New("sundial: Config.Endpoints, Config.Group and at least one handler are required")
	}
	streamCtx, closeStream := context.WithCancel(context.Background())
	defer closeStream()
	watchdogDone := make(chan struct{})
	go e.watchdog(streamCtx, watchdogDone)
	sessions := make(chan struct{})
	go func() {
		defer close(sessions)
		e.connectLoop(streamCtx)
	}()
	<-ctx.Done()
	e.drain()
	closeStream()
	<-sessions
	<-watchdogDone
	return nil
}

// connectLoop runs sessions until ctx ends, with jittered exponential backoff between
// attempts that got no Welcome.
func (e *Executor) connectLoop(ctx context.Context) {
	backoff := 100 * time.Millisecond
	for attempt := 0; ctx.Err() == nil; attempt++ {
		endpoint := e.endpoint(attempt)
		welcomed, err := e.session(ctx, endpoint)
		if ctx.Err() != nil {
			return
		}
		if welcomed {
			backoff = 100 * time.Millisecond
		} else {
			backoff = min(backoff*2, 5*time.Second)
		}
		wait := jitter(backoff)
		e.log.Warn("stream ended; reconnecting", "endpoint", endpoint, "err", err, "in", wait)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// jitter spreads a delay over [d/2, d] so executors do not reconnect in step.
func jitter(d time.Duration) time.Duration {
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}

func (e *Executor) endpoint(attempt int) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	list := e.cfg.Endpoints
	if len(e.goAwayTo) > 0 {
		list = e.goAwayTo
	}
	return list[attempt%len(list)]
}

// session is one stream: Hello, Welcome, then messages until it ends.
func (e *Executor) session(ctx context.Context, endpoint string) (welcomed bool, err error) {
	conn, err := grpc.NewClient(dialTarget(endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return false, err
	}
	defer conn.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := pb.NewExecutorServiceClient(conn).Connect(sctx)
	if err != nil {
		return false, err
	}
	out := newOutbox()
	defer e.sessionOver(out)
	e.mu.Lock()
	hello := &pb.Hello{
		NodeId: e.cfg.NodeID, Group: e.cfg.Group, Handlers: e.handlerNames(),
		MaxConcurrency: e.cfg.MaxConcurrency, Labels: e.cfg.Labels, Token: e.cfg.Token,
		Sdk: SDK, InFlight: e.heldRefs(func(h *held) bool { return h.phase != admitted }),
	}
	e.mu.Unlock()
	out.push(&pb.ExecutorMessage{Msg: &pb.ExecutorMessage_Hello{Hello: hello}})
	sendErr := make(chan error, 1)
	go func() { sendErr <- out.drainTo(sctx, stream) }()
	for {
		msg, err := stream.Recv()
		if err != nil {
			select {
			case serr := <-sendErr:
				if serr != nil {
					return welcomed, serr
				}
			default:
			}
			return welcomed, err
		}
		switch m := msg.Msg.(type) {
		case *pb.ServerMessage_Welcome:
			welcomed = true
			e.welcome(sctx, m.Welcome, out)
		case *pb.ServerMessage_HeartbeatAck:
			e.heartbeatAck(m.HeartbeatAck)
		case *pb.ServerMessage_Dispatch:
			e.dispatch(m.Dispatch)
		case *pb.ServerMessage_StartAck:
			e.startAck(m.StartAck)
		case *pb.ServerMessage_ResultAck:
			e.resultAck(m.ResultAck)
		case *pb.ServerMessage_Cancel:
			e.log.Info("cancel", "schedule_id", m.Cancel.GetRun().GetScheduleId(), "reason", m.Cancel.GetReason())
			e.cancelRun(keyOf(m.Cancel.GetRun()))
		case *pb.ServerMessage_Drain:
			e.log.Info("draining", "reason", m.Drain.GetReason())
			e.mu.Lock()
			e.draining = true
			e.mu.Unlock()
			e.heartbeat()
		case *pb.ServerMessage_Undrain:
			e.log.Info("undrained: taking work again", "reason", m.Undrain.GetReason())
			e.mu.Lock()
			e.draining = false
			e.mu.Unlock()
			e.heartbeat()
		case *pb.ServerMessage_GoAway:
			e.mu.Lock()
			e.goAwayTo = m.GoAway.GetEndpoints()
			e.mu.Unlock()
			return welcomed, fmt.Errorf("go away: %s", m.GoAway.GetReason())
		}
	}
}

// dialTarget accepts "host:port" and the "http://host:port" form GoAway uses.
func dialTarget(endpoint string) string {
	return strings.TrimPrefix(endpoint, "http://")
}

// sessionOver: offline until the next Welcome; dispatches that got no go-ahead are
// forgotten and rejected after the next Welcome.
func (e *Executor) sessionOver(out *outbox) {
	out.close()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.out == out {
		e.out = nil
	}
	for k, h := range e.runs {
		if h.phase == admitted {
			delete(e.runs, k)
			e.toReject = append(e.toReject, k)
		}
	}
}

func (e *Executor) welcome(ctx context.Context, w *pb.Welcome, out *outbox) {
	for _, r := range w.GetUnknownInFlight() {
		e.cancelRun(keyOf(r))
	}
	e.mu.Lock()
	e.out = out
	if ttl := time.Duration(w.GetLeaseTtlMs()) * time.Millisecond; ttl > 0 {
		e.leaseTTL = ttl
	}
	for _, k := range e.toReject {
		e.send(&pb.ExecutorMessage{Msg: &pb.ExecutorMessage_Reject{Reject: &pb.Reject{
			Run: k.ref(), Reason: "not started: the stream broke before the go-ahead"}}})
	}
	e.toReject = nil
	now := time.Now()
	for _, h := range e.runs {
		h.renewed = now // Hello.in_flight renewed them
		if h.phase == awaitingAck {
			e.send(&pb.ExecutorMessage{Msg: &pb.ExecutorMessage_Result{Result: h.result}})
		}
	}
	e.mu.Unlock()
	interval := max(time.Duration(w.GetHeartbeatIntervalMs())*time.Millisecond, 50*time.Millisecond)
	e.heartbeat()
	go func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				e.heartbeat()
			}
		}
	}()
	e.log.Info("connected", "server_instance", w.GetServerInstance())
	if e.cfg.OnWelcome != nil {
		e.cfg.OnWelcome(w.GetServerInstance())
	}
}

// send queues a message on the current stream; dropped while offline (what matters
// is resent after the next Welcome). Callers hold e.mu.
func (e *Executor) send(m *pb.ExecutorMessage) {
	if e.out != nil {
		e.out.push(m)
	}
}

func (e *Executor) heartbeat() {
	e.mu.Lock()
	defer e.mu.Unlock()
	active := 0
	for _, h := range e.runs {
		if h.phase == executing {
			active++
		}
	}
	e.send(&pb.ExecutorMessage{Msg: &pb.ExecutorMessage_Heartbeat{Heartbeat: &pb.Heartbeat{
		InFlight: e.heldRefs(func(*held) bool { return true }),
		Active:   uint32(active),
		NotReady: e.draining || e.stopping,
	}}})
}

func (e *Executor) heartbeatAck(ack *pb.HeartbeatAck) {
	now := time.Now()
	for _, l := range ack.GetLeases() {
		k := keyOf(l.GetRun())
		if l.GetRemainingMs() <= 0 {
			e.log.Info("lease gone", "schedule_id", k.scheduleID)
			e.cancelRun(k)
			continue
		}
		e.mu.Lock()
		if h := e.runs[k]; h != nil {
			h.renewed = now
		}
		e.mu.Unlock()
	}
}

// watchdog cancels handlers whose lease was not renewed within the lease TTL on this
// process's clock: the server may have given the run to another node meanwhile.
func (e *Executor) watchdog(ctx context.Context, done chan<- struct{}) {
	defer close(done)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		var expired []key
		e.mu.Lock()
		for k, h := range e.runs {
			if h.phase != awaitingAck && !h.cancelled && time.Since(h.renewed) > e.leaseTTL {
				expired = append(expired, k)
			}
		}
		e.mu.Unlock()
		for _, k := range expired {
			e.log.Warn("lease not renewed in time; stopping the handler", "schedule_id", k.scheduleID)
			e.cancelRun(k)
		}
	}
}

func (e *Executor) dispatch(d *pb.Dispatch) {
	k := keyOf(d.GetRun())
	e.mu.Lock()
	defer e.mu.Unlock()
	if h := e.runs[k]; h != nil {
		if h.phase == awaitingAck { // dispatched again: answer with the kept result
			e.send(&pb.ExecutorMessage{Msg: &pb.ExecutorMessage_Result{Result: h.result}})
		}
		return
	}
	handler := e.handlers[d.GetHandler()]
	reason := ""
	switch {
	case handler == nil:
		reason = "unknown handler " + d.GetHandler()
	case e.draining || e.stopping:
		reason = "draining"
	case e.holding() >= e.window():
		reason = "busy"
	}
	if reason != "" {
		e.send(&pb.ExecutorMessage{Msg: &pb.ExecutorMessage_Reject{Reject: &pb.Reject{Run: d.GetRun(), Reason: reason}}})
		return
	}
	e.runs[k] = &held{phase: admitted, dispatch: d, handler: handler, renewed: time.Now()}
	e.send(&pb.ExecutorMessage{Msg: &pb.ExecutorMessage_Started{Started: &pb.Started{Run: d.GetRun()}}})
}

// holding counts the runs that take a slot of the window: admitted or executing.
func (e *Executor) holding() int {
	n := 0
	for _, h := range e.runs {
		if h.phase != awaitingAck {
			n++
		}
	}
	return n
}

func (e *Executor) startAck(ack *pb.StartAck) {
	k := keyOf(ack.GetRun())
	e.mu.Lock()
	defer e.mu.Unlock()
	h := e.runs[k]
	if h == nil || h.phase != admitted {
		return // already started, or forgotten
	}
	if !ack.GetGo() {
		delete(e.runs, k)
		e.log.Info("not starting: the lease is gone", "schedule_id", k.scheduleID, "reason", ack.GetReason())
		return
	}
	if h.cancelled || e.stopping { // cancelled before the go-ahead, or shutting down: route it again
		delete(e.runs, k)
		e.send(&pb.ExecutorMessage{Msg: &pb.ExecutorMessage_Reject{Reject: &pb.Reject{
			Run: k.ref(), Reason: "not started: cancelled before the go-ahead"}}})
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	if ms := h.dispatch.GetDeadlineMs(); ms > 0 {
		ctx, cancel = context.WithTimeout(context.Background(), time.Duration(ms)*time.Millisecond)
	}
	h.phase, h.cancel = executing, cancel
	e.handlerWG.Add(1)
	go e.execute(ctx, k, h)
}

func (e *Executor) execute(ctx context.Context, k key, h *held) {
	defer e.handlerWG.Done()
	d := h.dispatch
	run := &Run{
		ScheduleID: k.scheduleID, JobID: d.GetJobId(), Attempt: k.attempt, ShardIndex: k.shard,
		ShardTotal: d.GetShardTotal(), Payload: d.GetPayload(), RouteKey: d.GetRouteKey(),
		Labels: d.GetLabels(), ScheduledAt: time.UnixMilli(d.GetScheduledAtMs()),
	}
	started := time.Now()
	output, err := callHandler(ctx, h.handler, run)
	result := resultOf(k.ref(), output, err, started, time.Now())
	e.mu.Lock()
	defer e.mu.Unlock()
	h.cancel()
	if h.cancelled { // cancelled, or the lease is gone: a Result would be refused
		delete(e.runs, k)
		return
	}
	h.phase, h.result = awaitingAck, result
	e.send(&pb.ExecutorMessage{Msg: &pb.ExecutorMessage_Result{Result: result}})
}

// callHandler turns a panic into a failure: a handler bug fails its run, not the process.
func callHandler(ctx context.Context, h Handler, run *Run) (out []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			out, err = nil, &Failure{Code: "panic", Message: fmt.Sprint(p)}
		}
	}()
	return h(ctx, run)
}

// resultOf is the Result for a handler's return values.
func resultOf(ref *pb.RunRef, output []byte, err error, started, finished time.Time) *pb.Result {
	r := &pb.Result{Run: ref, Output: output, StartedAtMs: started.UnixMilli(), FinishedAtMs: finished.UnixMilli()}
	var f *Failure
	switch {
	case err == nil:
		r.Status = pb.ResultStatus_RESULT_STATUS_SUCCEEDED
	case errors.Is(err, ErrCancelled):
		r.Status = pb.ResultStatus_RESULT_STATUS_CANCELLED
	case errors.As(err, &f):
		r.Status, r.ErrorCode, r.ErrorMessage = pb.ResultStatus_RESULT_STATUS_FAILED, f.Code, f.Message
	default:
		r.Status, r.ErrorCode, r.ErrorMessage = pb.ResultStatus_RESULT_STATUS_FAILED, "error", err.Error()
	}
	return r
}

func (e *Executor) resultAck(ack *pb.ResultAck) {
	k := keyOf(ack.GetRun())
	e.mu.Lock()
	defer e.mu.Unlock()
	if h := e.runs[k]; h != nil && h.phase == awaitingAck {
		if !ack.GetAccepted() {
			e.log.Warn("result refused", "schedule_id", k.scheduleID, "reason", ack.GetReason())
		}
		delete(e.runs, k)
	}
}

// cancelRun stops a held run: an executing handler's context is cancelled, an admitted
// dispatch is rejected when its go-ahead comes. A run not held is ignored.
func (e *Executor) cancelRun(k key) {
	e.mu.Lock()
	defer e.mu.Unlock()
	h := e.runs[k]
	if h == nil || h.phase == awaitingAck {
		return
	}
	h.cancelled = true
	if h.cancel != nil {
		h.cancel()
	}
}

// drain stops admitting work, lets handlers finish within the grace and their Results
// be acknowledged, then cancels whatever still runs.
func (e *Executor) drain() {
	e.mu.Lock()
	e.stopping = true
	e.mu.Unlock()
	e.heartbeat()
	deadline := time.Now().Add(e.cfg.ShutdownGrace)
	for time.Now().Before(deadline) {
		e.mu.Lock()
		busy := 0
		for _, h := range e.runs {
			if h.phase != awaitingAck || e.out != nil {
				busy++
			}
		}
		e.mu.Unlock()
		if busy == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	e.mu.Lock()
	for k := range e.runs {
		if h := e.runs[k]; h.cancel != nil && h.phase == executing {
			h.cancelled = true
			h.cancel()
		}
	}
	e.mu.Unlock()
	e.handlerWG.Wait()
}

func (e *Executor) handlerNames() []string {
	names := make([]string, 0, len(e.handlers))
	for n := range e.handlers {
		names = append(names, n)
	}
	return names
}

// heldRefs lists the held runs that pass keep. Callers hold e.mu.
func (e *Executor) heldRefs(keep func(*held) bool) []*pb.RunRef {
	refs := make([]*pb.RunRef, 0, len(e.runs))
	for k, h := range e.runs {
		if keep(h) {
			refs = append(refs, k.ref())
		}
	}
	return refs
}

// sanitize keeps a node id within [A-Za-z0-9._-].
func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		ok := c == '.' || c == '_' || c == '-' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
		if !ok {
			b[i] = '-'
		}
	}
	if len(b) > 128 {
		b = b[:128]
	}
	return string(b)
}
