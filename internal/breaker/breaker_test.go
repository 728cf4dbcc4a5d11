package breaker

import (
	"sync"
	"testing"
	"time"
)

func TestBreakerOpensAfterThresholdAndClosesOnSuccess(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var got []Transition
	b := New(Config{Threshold: 3, ProbeInterval: time.Second}, func(tr Transition) { got = append(got, tr) })

	for i := 0; i < 2; i++ {
		b.Failure(t0)
		if !b.Allow() {
			t.Fatalf("after %d failures Allow() = false, want true (threshold 3)", i+1)
		}
	}
	b.Success(t0) // resets the count
	b.Failure(t0)
	b.Failure(t0)
	if !b.Allow() {
		t.Fatal("a success must reset the consecutive-failure count")
	}
	b.Failure(t0)
	if b.Allow() || b.State() != Open {
		t.Fatalf("after 3 consecutive failures state = %v, want open", b.State())
	}
	if !b.OpenSince().Equal(t0) {
		t.Fatalf("OpenSince() = %v, want %v", b.OpenSince(), t0)
	}
	b.Success(t0.Add(5 * time.Second))
	if !b.Allow() {
		t.Fatal("a success while open must close the breaker")
	}
	if len(got) != 2 || got[0].To != Open || got[1].To != Closed || !got[1].Since.Equal(t0) {
		t.Fatalf("transitions = %+v, want open then closed (since %v)", got, t0)
	}
}

func TestProbeDueSpacing(t *testing.T) {
	t0 := time.Unix(1000, 0)
	b := New(Config{Threshold: 1, ProbeInterval: time.Second}, nil)
	if b.ProbeDue(t0) {
		t.Fatal("ProbeDue while closed = true, want false")
	}
	b.Failure(t0)
	tests := []struct {
		at   time.Duration
		want bool
	}{
		{0, false},
		{999 * time.Millisecond, false},
		{time.Second, true},
		{time.Second + time.Millisecond, false}, // slot taken by the previous probe
		{2 * time.Second, true},
	}
	for _, tt := range tests {
		if got := b.ProbeDue(t0.Add(tt.at)); got != tt.want {
			t.Errorf("ProbeDue(t0+%v) = %v, want %v", tt.at, got, tt.want)
		}
	}
}

func TestConcurrentUse(t *testing.T) {
	b := New(DefaultConfig(), nil)
	now := time.Now()
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for j := 0; j < 1000; j++ {
				if (i+j)%2 == 0 {
					b.Failure(now)
				} else {
					b.Success(now)
				}
				b.Allow()
				b.ProbeDue(now)
			}
		}(i)
	}
	wg.Wait()
	b.Success(now)
	if !b.Allow() {
		t.Fatal("breaker must be closed after a final success")
	}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("DefaultConfig().Validate() = %v", err)
	}
	for _, c := range []Config{{Threshold: 0, ProbeInterval: time.Second}, {Threshold: 1}} {
		if c.Validate() == nil {
			t.Errorf("Validate(%+v) = nil, want error", c)
		}
	}
}
