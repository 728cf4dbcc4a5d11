package main

import (
	"bytes"
	"flag"
	"io"
	"regexp"
	"testing"

	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// -safe-share and -allow-overshoot reach the request only when given, and
// the tunings table shows a pending safe-share change.
func TestTuneFlagsSafeShare(t *testing.T) {
	parse := func(args ...string) *rationv1.TuneRequest {
		t.Helper()
		var f tuneFlags
		fs := flag.NewFlagSet("tune", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		f.bind(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		req, err := f.request(fs)
		if err != nil {
			t.Fatal(err)
		}
		return req
	}
	req := parse("-rule", "g", "-region", "eu", "-safe-share", "0", "-allow-overshoot")
	if req.Tuning.SafeShare == nil || *req.Tuning.SafeShare != 0 || !req.AllowOvershoot {
		t.Errorf("request = %v, want safe_share 0 and allow_overshoot", req)
	}
	if req := parse("-rule", "g", "-region", "eu", "-weight", "2"); req.Tuning.SafeShare != nil || req.AllowOvershoot {
		t.Errorf("request = %v, want no safe share", req)
	}
	to, from := 30.0, 20.0
	var out bytes.Buffer
	printTunings(&out, []*rationv1.Tuning{{Rule: "g", Region: "eu", SafeShare: &to, SafeSharePendingFrom: &from}})
	if !regexp.MustCompile(`g\s+eu\s+-\s+-\s+-\s+-\s+-\s+30 \(pending from 20\)`).MatchString(out.String()) {
		t.Errorf("tunings printed %q, want safe share 30 pending from 20", out.String())
	}
}
