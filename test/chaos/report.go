package chaos

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Row is one line of the chaos table: a scenario's worst quota against
// its bound.
type Row struct {
	Scenario  string
	Fault     string
	Bound     string  // as stated, e.g. "0" or "N(b_e + r_e P) = 70"
	Overshoot float64 // measured, tokens (clamped at 0)
	Util      float64 // utilisation of the quota the row is about; NaN: n/a
	Pass      bool
	Note      string
}

var report struct {
	mu   sync.Mutex
	rows []Row
}

func addRow(t testing.TB, r Row) {
	r.Overshoot = math.Max(r.Overshoot, 0)
	report.mu.Lock()
	report.rows = append(report.rows, r)
	report.mu.Unlock()
	t.Logf("chaos: %s", formatRow(r))
}

func formatRow(r Row) string {
	pass := "pass"
	if !r.Pass {
		pass = "FAIL"
	}
	util := "n/a"
	if !math.IsNaN(r.Util) {
		util = strconv.FormatFloat(r.Util, 'f', 3, 64)
	}
	return fmt.Sprintf("| %s | %s | %s | %.3f | %s | %s | %s |", r.Scenario, r.Fault, r.Bound, r.Overshoot, util, pass, r.Note)
}

// Table is the markdown table of every row so far, in scenario order.
func Table() string {
	report.mu.Lock()
	rows := append([]Row(nil), report.rows...)
	report.mu.Unlock()
	slices.SortStableFunc(rows, func(a, b Row) int {
		if n := scenarioNumber(a.Scenario) - scenarioNumber(b.Scenario); n != 0 {
			return n
		}
		return strings.Compare(a.Scenario, b.Scenario)
	})
	var b strings.Builder
	b.WriteString("| scenario | fault | bound (tokens) | measured overshoot | utilisation | result | notes |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- |\n")
	for _, r := range rows {
		b.WriteString(formatRow(r) + "\n")
	}
	return b.String()
}

// scenarioNumber is n of "Sn ...", for ordering the table.
func scenarioNumber(s string) int {
	s = strings.TrimPrefix(s, "S")
	if i := strings.IndexByte(s, ' '); i >= 0 {
		s = s[:i]
	}
	n, _ := strconv.Atoi(s)
	return n
}

const (
	reportBegin = "<!-- chaos:begin -->"
	reportEnd   = "<!-- chaos:end -->"
)

// writeReport prints the table and, when RATION_CHAOS_REPORT names a file
// (docs/reliability.md under make chaos), replaces the text between its
// chaos markers with the table and the date.
func writeReport() error {
	report.mu.Lock()
	n := len(report.rows)
	report.mu.Unlock()
	if n == 0 {
		return nil
	}
	table := Table()
	fmt.Println("\n" + table)
	path := os.Getenv("RATION_CHAOS_REPORT")
	if path == "" {
		return nil
	}
	old, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	s := string(old)
	i, j := strings.Index(s, reportBegin), strings.Index(s, reportEnd)
	if i < 0 || j < i {
		return fmt.Errorf("%s: no %s ... %s markers", path, reportBegin, reportEnd)
	}
	body := fmt.Sprintf("%s\nMeasured %s on %s (seed %d; `RATION_CHAOS_SEED=%d` replays the fault schedule).\n\n%s%s",
		reportBegin, time.Now().UTC().Format("2006-01-02 15:04 MST"), commit(), seedValue, seedValue, table, reportEnd)
	return os.WriteFile(path, []byte(s[:i]+body+s[j+len(reportEnd):]), 0o644)
}

// commit names the tree the binaries were built from: the commit, and
// whether the work tree differed from it (published figures must come from
// a committed tree).
func commit() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "an unknown commit (no git)"
	}
	c := "commit `" + strings.TrimSpace(string(out)) + "`"
	if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(st) > 0 {
		c += " (work tree differs)"
	}
	return c
}

// seedValue drives every random choice of the suite (fault timings,
// subjects); RATION_CHAOS_SEED replays a run.
var seedValue = func() uint64 {
	if s := os.Getenv("RATION_CHAOS_SEED"); s != "" {
		if v, err := strconv.ParseUint(s, 10, 64); err == nil {
			return v
		}
	}
	return uint64(time.Now().UnixNano())
}()

// rng is a scenario's random source, seeded from the suite seed and its
// name, logged so a failure can be replayed.
func rng(t testing.TB) *rand.Rand {
	var h uint64 = 1469598103934665603
	for _, c := range t.Name() {
		h = (h ^ uint64(c)) * 1099511628211
	}
	t.Logf("chaos: seed %d (replay with RATION_CHAOS_SEED=%d -run '^%s$')", seedValue, seedValue, t.Name())
	return rand.New(rand.NewPCG(seedValue, h))
}

// broken reports whether scenario s runs with its protection removed
// (RATION_CHAOS_BREAK=S3, comma separated): the run must then fail, which
// shows the scenario can.
func broken(s string) bool {
	for _, b := range strings.Split(os.Getenv("RATION_CHAOS_BREAK"), ",") {
		if strings.TrimSpace(b) == s {
			return true
		}
	}
	return false
}
