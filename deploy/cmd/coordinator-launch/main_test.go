package main

import (
	"errors"
	"net"
	"slices"
	"strings"
	"testing"
)

func TestDecide(t *testing.T) {
	found := func(string) ([]string, error) { return []string{"10.0.0.7"}, nil }
	notFound := func(h string) ([]string, error) {
		return nil, &net.DNSError{Err: "no such host", Name: h, IsNotFound: true}
	}
	broken := func(h string) ([]string, error) {
		return nil, &net.DNSError{Err: "server misbehaving", Name: h, IsTemporary: true}
	}
	base := []string{"PATH=/", "RATION_JOIN=coordinator.ration.svc:8301", "RATION_DATA_DIR=/var/lib/ration/raft"}
	with := func(kv ...string) []string { return append(slices.Clone(base), kv...) }
	bootstrapped := []string{"PATH=/", "RATION_DATA_DIR=/var/lib/ration/raft", "POD_NAME=coordinator-0", "RATION_BOOTSTRAP=true"}

	for _, tc := range []struct {
		name    string
		args    []string
		env     []string
		lookup  func(string) ([]string, error)
		want    []string // nil: want an error
		wantErr string
	}{
		{"ordinal 0, nobody ready: bootstrap", nil, with("POD_NAME=coordinator-0"), notFound, bootstrapped, ""},
		{"ordinal 0, a member is ready: join", nil, with("POD_NAME=coordinator-0"), found, with("POD_NAME=coordinator-0"), ""},
		{"ordinal 0, DNS broken: refuse", nil, with("POD_NAME=coordinator-0"), broken, nil, "not bootstrapping"},
		{"ordinal 1 joins without asking DNS", nil, with("POD_NAME=coordinator-1"), nil, with("POD_NAME=coordinator-1"), ""},
		{"ordinal 12 joins", nil, with("POD_NAME=ration-coordinator-12"), nil, with("POD_NAME=ration-coordinator-12"), ""},
		{"no POD_NAME", nil, base, found, nil, "POD_NAME"},
		{"POD_NAME without ordinal", nil, with("POD_NAME=coordinator"), found, nil, "NAME-ORDINAL"},
		{"POD_NAME with a non-canonical ordinal", nil, with("POD_NAME=coordinator-01"), found, nil, "NAME-ORDINAL"},
		{"no RATION_JOIN", nil, []string{"POD_NAME=coordinator-0"}, notFound, nil, "RATION_JOIN is empty"},
		{"RATION_JOIN without port", nil, []string{"POD_NAME=coordinator-0", "RATION_JOIN=coordinator"}, notFound, nil, "RATION_JOIN"},
		{"RATION_BOOTSTRAP preset", nil, with("POD_NAME=coordinator-1", "RATION_BOOTSTRAP=false"), found, nil, "RATION_BOOTSTRAP"},
		{"-bootstrap argument", []string{"-bootstrap"}, with("POD_NAME=coordinator-1"), found, nil, "chosen by the launcher"},
		{"--join= argument", []string{"--join=x:1"}, with("POD_NAME=coordinator-1"), found, nil, "chosen by the launcher"},
		{"other arguments pass", []string{"-log-level=debug"}, with("POD_NAME=coordinator-2"), nil, with("POD_NAME=coordinator-2"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lookup := tc.lookup
			if lookup == nil {
				lookup = func(h string) ([]string, error) {
					t.Errorf("lookup(%q) called for an ordinal above 0", h)
					return nil, errors.New("unexpected")
				}
			}
			got, err := decide(tc.args, tc.env, lookup)
			if tc.want == nil {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("decide = %q, %v; want an error containing %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("decide: %v", err)
			}
			if !slices.Equal(sorted(got), sorted(tc.want)) {
				t.Errorf("decide env = %q, want %q", got, tc.want)
			}
		})
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}
