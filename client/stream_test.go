package client_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ration-dev/ration/client"
)

// Concurrent callers share one stream and each gets its own answer.
func TestStreamConcurrentCallers(t *testing.T) {
	f, addr := startFake(t)
	c := newClient(t, addr, client.Options{Timeout: 10 * time.Second})
	s := c.AllowStream(context.Background())
	defer s.Close()
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				subject := fmt.Sprintf("g%d-%d", g, i)
				d, err := s.Allow(context.Background(), req(subject))
				if err != nil || !d.Allowed || d.Rule != subject {
					t.Errorf("Stream.Allow(%s) = %+v, %v; want its own answer", subject, d, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if n := f.streams.Load(); n != 1 {
		t.Fatalf("%d streams opened for 800 decisions, want 1", n)
	}
}

// An invalid request fails alone; the stream goes on.
func TestStreamInvalidRequest(t *testing.T) {
	f, addr := startFake(t)
	s := newClient(t, addr, client.Options{}).AllowStream(context.Background())
	defer s.Close()
	if _, err := s.Allow(context.Background(), req("bad")); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("Stream.Allow(bad) = %v, want ErrInvalid", err)
	}
	if d, err := s.Allow(context.Background(), req("over")); err != nil || d.Reason != client.ReasonOverLimit || d.Status() != 429 {
		t.Fatalf("Stream.Allow(over) = %+v, %v; want over_limit", d, err)
	}
	if n := f.streams.Load(); n != 1 {
		t.Fatalf("%d streams, want 1", n)
	}
}

// A caller that gives up does not shift the answers of the others: its
// answer is dropped when it comes.
func TestStreamCallerGivesUp(t *testing.T) {
	f, addr := startFake(t)
	f.delay.Store(int64(300 * time.Millisecond))
	s := newClient(t, addr, client.Options{Timeout: 10 * time.Second}).AllowStream(context.Background())
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := s.Allow(ctx, req("slow")); !errors.Is(err, client.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stream.Allow(slow) past its deadline = %v, want ErrUnavailable and DeadlineExceeded", err)
	}
	for _, subject := range []string{"next", "after"} {
		if d, err := s.Allow(context.Background(), req(subject)); err != nil || d.Rule != subject {
			t.Fatalf("Stream.Allow(%s) = %+v, %v; want its own answer, not the slow one's", subject, d, err)
		}
	}
	if n := f.streams.Load(); n != 1 {
		t.Fatalf("%d streams, want 1: a caller's deadline does not end the stream", n)
	}
}

// When the stream ends (the agent restarting), the decision waiting on it
// fails with ErrUnavailable and the next one opens a new stream.
func TestStreamReopens(t *testing.T) {
	f, addr := startFake(t)
	f.endAfter.Store(3)
	s := newClient(t, addr, client.Options{Timeout: 10 * time.Second}).AllowStream(context.Background())
	defer s.Close()
	var got []string
	for i := 0; i < 8; i++ {
		_, err := s.Allow(context.Background(), req("u"))
		switch {
		case err == nil:
			got = append(got, "ok")
		case errors.Is(err, client.ErrUnavailable):
			got = append(got, "unavailable")
		default:
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if want := "[ok ok ok unavailable ok ok ok unavailable]"; fmt.Sprint(got) != want {
		t.Fatalf("calls = %v, want %s (each stream answers 3, then ends on the 4th)", got, want)
	}
	if n := f.streams.Load(); n != 2 {
		// The 9th call would open the third.
		t.Fatalf("%d streams, want 2", n)
	}
}

// After Close every decision fails with ErrUnavailable, and so does one
// waiting when it is called.
func TestStreamClose(t *testing.T) {
	f, addr := startFake(t)
	f.delay.Store(int64(time.Hour))
	s := newClient(t, addr, client.Options{Timeout: time.Hour}).AllowStream(context.Background())
	if _, err := s.Allow(context.Background(), req("u")); err != nil {
		t.Fatal(err)
	}
	waiting := make(chan error, 1)
	go func() {
		_, err := s.Allow(context.Background(), req("slow"))
		waiting <- err
	}()
	time.Sleep(50 * time.Millisecond)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-waiting:
		if !errors.Is(err, client.ErrUnavailable) {
			t.Fatalf("decision waiting at Close = %v, want ErrUnavailable", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a decision waiting at Close did not return")
	}
	if _, err := s.Allow(context.Background(), req("u")); !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("Allow after Close = %v, want ErrUnavailable", err)
	}
}
