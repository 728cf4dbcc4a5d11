package tokenfile

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const tok = "0123456789abcdef0123"

func write(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestRead(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, content, want, err string
	}{
		{"trailing newline", tok + "\n", tok, ""},
		{"surrounding space", "  " + tok + " \r\n", tok, ""},
		{"empty", "\n", "", "is empty"},
		{"short", "secret\n", "", "token of 6 bytes, want at least 16"},
		{"two words", tok + " " + tok, "", "white space"},
		{"two lines", tok + "\n" + tok, "", "white space"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-"))
			write(t, p, tc.content)
			got, err := Read(p)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Read = %q, %v; want an error with %q", got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Read = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	if _, err := Read(filepath.Join(dir, "missing")); err == nil {
		t.Error("Read of a missing file succeeded")
	}
}

// TestReload: a new token written over the file is put in force (and
// matched) at the next check; a file that holds no usable token keeps the
// token in force.
func TestReload(t *testing.T) {
	p := filepath.Join(t.TempDir(), "token")
	write(t, p, tok+"\n")
	if _, err := Open(filepath.Join(t.TempDir(), "missing"), Options{}); err == nil {
		t.Fatal("Open of a missing file succeeded")
	}
	tk, err := Open(p, Options{Interval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer tk.Close()
	if !tk.Match(tok) || tk.Match(tok+"x") || tk.Match("") || tk.Match(tok[:len(tok)-1]) {
		t.Fatal("Match does not accept exactly the token")
	}
	next := strings.Repeat("z", MinLen+4)
	write(t, p, next+"\n")
	deadline := time.Now().Add(5 * time.Second)
	for !tk.Match(next) {
		if time.Now().After(deadline) {
			t.Fatal("the new token is not in force 5s after the file changed")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if tk.Match(tok) || tk.Reloads() != 1 || tk.Value() != next {
		t.Errorf("after the rotation: old token matches %v, reloads %d, value %q", tk.Match(tok), tk.Reloads(), tk.Value())
	}
	// Half-written (empty) and removed files keep the token in force.
	write(t, p, "")
	if changed, err := tk.Reload(); changed || err == nil {
		t.Errorf("Reload of an empty file = %v, %v; want an error and no change", changed, err)
	}
	os.Remove(p)
	if changed, err := tk.Reload(); changed || err == nil {
		t.Errorf("Reload of a removed file = %v, %v; want an error and no change", changed, err)
	}
	if !tk.Match(next) {
		t.Error("a failed reload dropped the token in force")
	}
}

func TestHeader(t *testing.T) {
	md, err := Bearer(tok).GetRequestMetadata(context.Background())
	if err != nil || md[MetadataKey] != "Bearer "+tok {
		t.Fatalf("metadata %v, %v", md, err)
	}
	for v, want := range map[string]string{"Bearer " + tok: tok, "bearer " + tok: tok, "Basic " + tok: "", tok: ""} {
		got, ok := FromHeader(v)
		if got != want || ok != (want != "") {
			t.Errorf("FromHeader(%q) = %q, %v; want %q", v, got, ok, want)
		}
	}
}

// TestReloadWaitsForACompleteFile: a token file written in place is read
// while it is being written; its first bytes (16 or more: they would pass
// for a token) are not put in force, until the token ends in a newline. A
// file replaced by a rename is complete without one.
func TestReloadWaitsForACompleteFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "token")
	write(t, p, tok+"\n")
	tk, err := Open(p, Options{Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer tk.Close()
	inPlace := func(content string) {
		t.Helper()
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	next := strings.Repeat("n", 40)
	for _, tc := range []struct {
		name, content string
		replace       bool
		want          string // the token in force after
		incomplete    bool   // Reload says ErrIncomplete
	}{
		{"half written in place", next[:24], false, tok, true},
		{"half written, read again", next[:24], false, tok, true},
		{"whole, with its newline", next + "\n", false, next, false},
		{"renamed over it, without a newline", tok, true, tok, false},
	} {
		if tc.replace {
			write(t, p, tc.content)
		} else {
			inPlace(tc.content)
		}
		before := tk.Value()
		changed, err := tk.Reload()
		if tk.Value() != tc.want || changed != (before != tc.want) {
			t.Fatalf("%s: Reload = %v, %v; token in force %q, want %q", tc.name, changed, err, tk.Value(), tc.want)
		}
		if errors.Is(err, ErrIncomplete) != tc.incomplete {
			t.Errorf("%s: err %v, want ErrIncomplete %v", tc.name, err, tc.incomplete)
		}
	}
}
