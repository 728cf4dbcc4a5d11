package rules

import (
	"fmt"
	"strings"
	"testing"
)

// BenchmarkMatch measures one decision's matching among n rules: a wildcard
// rule per tenant (one subject string allocated) and n-1 exact endpoint
// rules, of which the request matches one, so the index must tell them
// apart.
func BenchmarkMatch(b *testing.B) {
	for _, n := range []int{1, 50, 1000} {
		b.Run(fmt.Sprintf("rules=%d", n), func(b *testing.B) {
			var src strings.Builder
			src.WriteString("rules:\n- {name: tenant, match: {tenant: '*'}, burst: 10, rate: 1}\n")
			for i := 1; i < n; i++ {
				fmt.Fprintf(&src, "- {name: r%d, match: {endpoint: e%d, method: GET}, burst: 10, rate: 1}\n", i, i)
			}
			s, err := Parse("bench.yaml", []byte(src.String()))
			if err != nil {
				b.Fatal(err)
			}
			d := map[string]string{"tenant": "acme", "endpoint": fmt.Sprintf("e%d", n/2), "method": "GET", "region": "eu"}
			out := make([]Match, 0, 4)
			b.ReportAllocs()
			for b.Loop() {
				out = s.Match(d, out[:0])
			}
			if want := min(n, 2); len(out) != want {
				b.Fatalf("matched %d rules, want %d", len(out), want)
			}
		})
	}
}
