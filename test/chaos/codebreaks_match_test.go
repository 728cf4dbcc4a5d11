package chaos

import (
	"path/filepath"
	"testing"
)

// Every code break still names code that exists, once: a break whose Old
// text the code has moved away from cannot build its binaries, and
// test/chaos/breaks.sh is not part of make test, so nothing else would
// notice until someone ran it (S21's edit went stale when lending took a
// rate; only breaks.sh found it). Each break is applied alone, as
// RATION_CHAOS_BREAK names one.
func TestCodeBreaksMatchTheCode(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	for name := range codeBreaks {
		if _, err := editedFiles(root, []string{name}); err != nil {
			t.Error(err)
		}
	}
}
