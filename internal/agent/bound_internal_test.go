package agent

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A decision's store calls end by the sooner of the caller's deadline and
// the decision timeout, and when the caller hangs up, whichever context
// bound hands them.
func TestBoundDeadlines(t *testing.T) {
	s := &Service{cfg: Options{DecisionTimeout: time.Second}}

	// No deadline of the caller's: the decision timeout.
	before := time.Now()
	ctx, cancel := s.bound(context.Background())
	d, ok := ctx.Deadline()
	cancel()
	if !ok || d.Before(before.Add(time.Second)) || d.After(time.Now().Add(time.Second)) {
		t.Fatalf("no caller deadline: got %v %v, want the decision timeout from now", d, ok)
	}

	// A later deadline of the caller's: the decision timeout still.
	late, cancelLate := context.WithTimeout(context.Background(), time.Hour)
	defer cancelLate()
	ctx, cancel = s.bound(late)
	d, _ = ctx.Deadline()
	cancel()
	if d.After(time.Now().Add(time.Second)) {
		t.Fatalf("caller deadline in an hour: got %v, want the decision timeout from now", d)
	}
	if late.Err() != nil {
		t.Fatal("the cancel function of bound cancelled the caller's context")
	}

	// A sooner deadline: the caller's context itself, whose end (its
	// deadline or the caller hanging up) ends the store calls.
	soon, cancelSoon := context.WithTimeout(context.Background(), 20*time.Millisecond)
	ctx, cancel = s.bound(soon)
	if ctx != soon {
		t.Fatal("caller deadline sooner than the decision timeout: want the caller's context as it is")
	}
	cancel()
	if soon.Err() != nil {
		t.Fatal("the cancel function of bound cancelled the caller's context")
	}
	<-ctx.Done()
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("after the caller's deadline: %v, want deadline exceeded", ctx.Err())
	}
	cancelSoon()

	hangUp, hang := context.WithTimeout(context.Background(), 20*time.Millisecond)
	ctx, cancel = s.bound(hangUp)
	defer cancel()
	hang()
	select {
	case <-ctx.Done():
	case <-time.After(time.Second):
		t.Fatal("the caller hung up and the store calls' context is not done")
	}
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Fatalf("after the caller hung up: %v, want canceled", ctx.Err())
	}
}
