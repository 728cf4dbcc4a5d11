package admission

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// The log format, one decision per line, tab-separated:
//
//	at_ns  latency_ns  agent  quota  cost  allowed(1|0)  path  reason  lease  request_id  burst  rate
//
// at_ns is CLOCK_MONOTONIC in nanoseconds (shared by all processes of one
// host, so logs of several agents merge); empty lease and request_id are
// "-". A text field holding a tab, newline, backslash or quote, or "-"
// itself, is written Go-quoted. Lines starting with '#' are comments.
const logFields = 12

// AppendLine appends r as one log line (with its newline) to buf.
func AppendLine(buf []byte, r *Record) []byte {
	buf = strconv.AppendInt(buf, int64(r.At), 10)
	buf = append(buf, '\t')
	buf = strconv.AppendInt(buf, int64(r.Latency), 10)
	buf = append(buf, '\t')
	buf = appendText(buf, r.Agent)
	buf = append(buf, '\t')
	buf = appendText(buf, r.Quota)
	buf = append(buf, '\t')
	buf = strconv.AppendFloat(buf, r.Cost, 'g', -1, 64)
	if r.Allowed {
		buf = append(buf, "\t1\t"...)
	} else {
		buf = append(buf, "\t0\t"...)
	}
	buf = appendText(buf, r.Path)
	buf = append(buf, '\t')
	buf = appendText(buf, r.Reason)
	buf = append(buf, '\t')
	buf = appendText(buf, r.Lease)
	buf = append(buf, '\t')
	buf = appendText(buf, r.RequestID)
	buf = append(buf, '\t')
	buf = strconv.AppendFloat(buf, r.Burst, 'g', -1, 64)
	buf = append(buf, '\t')
	buf = strconv.AppendFloat(buf, r.Rate, 'g', -1, 64)
	return append(buf, '\n')
}

func appendText(buf []byte, s string) []byte {
	if s == "" {
		return append(buf, '-')
	}
	if s == "-" || strings.ContainsAny(s, "\t\n\r\\\"") {
		return strconv.AppendQuote(buf, s)
	}
	return append(buf, s...)
}

func parseText(s string) (string, error) {
	switch {
	case s == "-":
		return "", nil
	case strings.HasPrefix(s, `"`):
		return strconv.Unquote(s)
	}
	return s, nil
}

// Read parses a log. A torn last line (a process killed mid-write cannot
// tear a line, since each batch is one write, but a disk can fill up) is
// an error naming its line number, as is any malformed line.
func Read(r io.Reader) ([]Record, error) {
	var out []Record
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		s := sc.Text()
		if s == "" || s[0] == '#' {
			continue
		}
		rec, err := parseLine(s)
		if err != nil {
			return out, fmt.Errorf("admission: line %d: %w", line, err)
		}
		out = append(out, rec)
	}
	return out, sc.Err()
}

func parseLine(s string) (Record, error) {
	f := strings.Split(s, "\t")
	if len(f) != logFields {
		return Record{}, fmt.Errorf("%d fields, want %d", len(f), logFields)
	}
	var r Record
	var err error
	num := func(i int, name string) int64 {
		v, e := strconv.ParseInt(f[i], 10, 64)
		if e != nil && err == nil {
			err = fmt.Errorf("%s %q: %w", name, f[i], e)
		}
		return v
	}
	flt := func(i int, name string) float64 {
		v, e := strconv.ParseFloat(f[i], 64)
		if e != nil && err == nil {
			err = fmt.Errorf("%s %q: %w", name, f[i], e)
		}
		return v
	}
	txt := func(i int, name string) string {
		v, e := parseText(f[i])
		if e != nil && err == nil {
			err = fmt.Errorf("%s %q: %w", name, f[i], e)
		}
		return v
	}
	r.At = time.Duration(num(0, "at_ns"))
	r.Latency = time.Duration(num(1, "latency_ns"))
	r.Agent = txt(2, "agent")
	r.Quota = txt(3, "quota")
	r.Cost = flt(4, "cost")
	switch f[5] {
	case "1":
		r.Allowed = true
	case "0":
	default:
		if err == nil {
			err = fmt.Errorf("allowed %q: want 1 or 0", f[5])
		}
	}
	r.Path = txt(6, "path")
	r.Reason = txt(7, "reason")
	r.Lease = txt(8, "lease")
	r.RequestID = txt(9, "request_id")
	r.Burst = flt(10, "burst")
	r.Rate = flt(11, "rate")
	return r, err
}
