package sundial

import (
	"context"
	"sync"

	pb "github.com/sundial-sched/sundial/sdk-examples/go/gen/sundialv1"
)

// outbox is one stream's send queue. push never blocks (it is called with the
// executor's lock held), so a stream slow to take messages never stalls the reading
// of the server's messages; one goroutine sends them in order.
type outbox struct {
	mu     sync.Mutex
	items  []*pb.ExecutorMessage
	closed bool
	wake   chan struct{}
}

func newOutbox() *outbox { return &outbox{wake: make(chan struct{}, 1)} }

func (o *outbox) push(m *pb.ExecutorMessage) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return
	}
	o.items = append(o.items, m)
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

func (o *outbox) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closed = true
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// take returns the queued messages, waiting for one; nil once closed or ctx ends.
func (o *outbox) take(ctx context.Context) []*pb.ExecutorMessage {
	for {
		o.mu.Lock()
		items, closed := o.items, o.closed
		o.items = nil
		o.mu.Unlock()
		if closed {
			return nil
		}
		if len(items) > 0 {
			return items
		}
		select {
		case <-ctx.Done():
			return nil
		case <-o.wake:
		}
	}
}

// drainTo sends every pushed message in order until the outbox closes, ctx ends or a
// send fails.
func (o *outbox) drainTo(ctx context.Context, stream pb.ExecutorService_ConnectClient) error {
	for {
		items := o.take(ctx)
		if items == nil {
			return nil
		}
		for _, m := range items {
			if err := stream.Send(m); err != nil {
				return err
			}
		}
	}
}
