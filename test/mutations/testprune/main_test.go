package main

import (
	"path/filepath"
	"slices"
	"testing"
)

func TestUnneeded(t *testing.T) {
	dir := filepath.Join("testdata", "pkg")
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		tests []string
		drop  []string
	}{
		{[]string{"TestA"}, []string{"e_test.go"}},
		{[]string{"TestE"}, []string{"a_test.go", "b_test.go", "c_test.go", "d_test.go", "g_test.go", "h_test.go"}},
		{[]string{"TestA", "TestE"}, nil},
	} {
		got, err := Unneeded(dir, tc.tests)
		if err != nil {
			t.Fatalf("%v: %v", tc.tests, err)
		}
		var want []string
		for _, f := range tc.drop {
			want = append(want, filepath.Join(abs, f))
		}
		if !slices.Equal(got, want) {
			t.Errorf("Unneeded(%v) = %v, want %v", tc.tests, got, want)
		}
	}
	if _, err := Unneeded(dir, []string{"TestMissing"}); err == nil {
		t.Error("a test no file declares: no error, want one (the pattern would run nothing)")
	}
}
