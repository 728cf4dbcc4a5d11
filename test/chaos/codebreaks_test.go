package chaos

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// codeEdit replaces Old, which must occur exactly once, with New in File
// (a path from the module root).
type codeEdit struct {
	File, Old, New string
}

// codeBreaks are the breaks of the scenarios whose protection is a few
// lines inside the agent (S9, S19, S20, S21): under RATION_CHAOS_BREAK=<scenario>
// the gateway-agent and coordinator binaries are built with these edits
// (go build -overlay: the tree is not touched), so the scenario runs
// against the code without its protection and must fail by a judge. An
// edit that no longer matches its file fails the build, not the break:
// refresh it with the code.
var codeBreaks = map[string][]codeEdit{
	// One circuit breaker and outage episode for the whole store, as
	// before a Cluster's masters had one each: a dead master's failures
	// open it for every master.
	"S9":  s9Break,
	"S9f": s9Break,
	// A copy of the default lease forgotten once it is full again at a
	// shrunken cap, though it owes less than the default lease: its debt
	// (tokens the subject already spent) goes back to the pool at the
	// next renewal or release.
	"S19": {{File: "internal/holder/shared.go",
		Old: "return !q.owesLess && cp.Lent == 0 && (!cp.Valid(now) || cp.Available(now) >= cp.Lease.Cap)",
		New: "return cp.Lent == 0 && (!cp.Valid(now) || cp.Available(now) >= cp.Lease.Cap)"}},
	// An agent spends a promotion's lease for as long as the lease is
	// valid, not only within the mark it was told of: its marks never run
	// out, and a "gone" does not stop them.
	// An agent that sends an RLQS assignment without lending its
	// max_tokens and rate out of the lease first: the lease's balance and
	// refill stay whole, so every Envoy's assignment spends them again.
	"S21": {{File: "internal/holder/lend.go",
		Old: "if (wantT > 0 || wantR > 0) && q.h.Lend(now, wantT, wantR, held) {",
		New: "if (wantT > 0 || wantR > 0) && q.h.Available(now) >= wantT {"}},
	"S20": {
		{File: "internal/agent/hot.go",
			Old: "until := sentAt + lease.AgentValidity(p.For, hotDrift, hotPause.Microseconds())",
			New: "until := sentAt + lease.AgentValidity(p.For, hotDrift, hotPause.Microseconds()) + 1<<40"},
		{File: "internal/agent/hot.go",
			Old: "case bucket.MarkGone:\n\t\t\tk.until.Store(0)",
			New: "case bucket.MarkGone:"},
	},
}

// breakOverlay writes the edited files of every code break named in
// RATION_CHAOS_BREAK under dir and returns the go build flags that use
// them instead of the tree's (none when no code break is named). root is
// the module's root.
func breakOverlay(root, dir string) ([]string, error) {
	names := make([]string, 0, len(codeBreaks))
	for name := range codeBreaks {
		names = append(names, name)
	}
	slices.Sort(names)
	var chosen []string
	for _, name := range names {
		if broken(name) {
			chosen = append(chosen, name)
		}
	}
	files, err := editedFiles(root, chosen)
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, nil
	}
	replace := map[string]string{}
	for i, f := range slices.Sorted(maps.Keys(files)) {
		p := filepath.Join(dir, fmt.Sprintf("break%d_%s", i, filepath.Base(f)))
		if err := os.WriteFile(p, []byte(files[f]), 0o644); err != nil {
			return nil, err
		}
		replace[filepath.Join(root, f)] = p
	}
	b, err := json.Marshal(map[string]any{"Replace": replace})
	if err != nil {
		return nil, err
	}
	overlay := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(overlay, b, 0o644); err != nil {
		return nil, err
	}
	return []string{"-overlay", overlay}, nil
}

// s9Break: one breaker for the whole store (S9 and its failover variant).
var s9Break = []codeEdit{{File: "internal/agent/nodes.go",
	Old: "if r, ok := store.(nodeStore); ok && r.Sharded() {",
	New: "if r, ok := store.(nodeStore); ok && r.Sharded() && false {"}}

// editedFiles applies the code breaks of names to the files they edit
// (module paths from root), in order, and returns the edited texts by
// module path. Each edit's Old must occur exactly once in its file as the
// earlier edits left it.
func editedFiles(root string, names []string) (map[string]string, error) {
	files := map[string]string{}
	for _, name := range names {
		for _, e := range codeBreaks[name] {
			text, ok := files[e.File]
			if !ok {
				b, err := os.ReadFile(filepath.Join(root, e.File))
				if err != nil {
					return nil, fmt.Errorf("break %s: %w", name, err)
				}
				text = string(b)
			}
			if n := strings.Count(text, e.Old); n != 1 {
				return nil, fmt.Errorf("break %s: %s holds %q %d times, want once: refresh the break with the code", name, e.File, e.Old, n)
			}
			files[e.File] = strings.Replace(text, e.Old, e.New, 1)
		}
	}
	return files, nil
}
