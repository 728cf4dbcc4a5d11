package holder

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// micros rounds up to whole microseconds without math.Ceil; it must agree
// with it wherever the result fits a Duration, and saturate past that.
func TestMicrosIsCeil(t *testing.T) {
	ceil := func(sec float64) time.Duration {
		return time.Duration(math.Ceil(sec*1e6)) * time.Microsecond
	}
	for _, sec := range []float64{1e-9, 1e-6, 1.5e-6, 0.001, 0.0010000001, 1, 1.0000005, 3600, 9.2e6, 9.2e9} {
		if got, want := micros(sec), ceil(sec); got != want {
			t.Errorf("micros(%v) = %v, want %v", sec, got, want)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		sec := math.Exp(r.Float64()*40 - 25) // about 1e-11 .. 4e6 s
		if got, want := micros(sec), ceil(sec); got != want {
			t.Fatalf("micros(%v) = %v, want %v", sec, got, want)
		}
	}
	for _, sec := range []float64{0, -1, math.NaN(), math.Inf(-1)} {
		if got := micros(sec); got != 0 {
			t.Errorf("micros(%v) = %v, want 0", sec, got)
		}
	}
	for _, sec := range []float64{1e13, math.MaxFloat64, math.Inf(1)} {
		if got := micros(sec); got != math.MaxInt64 {
			t.Errorf("micros(%v) = %v, want the longest Duration", sec, got)
		}
	}
}
