package agent

import (
	"fmt"
	"math"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ration-dev/ration/internal/rules"
)

// Names of the /v1/check parameters that are not descriptors.
const (
	checkCost      = "cost"
	checkRequestID = "request_id"
)

// DecodeCheck turns a check URL's raw query (URL.RawQuery, as sent) into a
// request: every parameter is a descriptor except cost and request_id.
//
// It refuses what url.ParseQuery would drop or guess at, since a dropped
// pair changes the decision (a lost cost charges 1, a lost request_id
// charges a retry again, a lost descriptor leaves its rule out): a
// malformed %-escape, a ";" (not a separator here), a pair without "=", an
// empty key, a key or value that is not UTF-8 once unescaped, a key given
// twice (which value would be meant is ambiguous), and a key that differs
// from cost or request_id only in case (a caller meaning cost would be
// charged 1). Empty pairs ("a=1&&b=2", a trailing "&") carry nothing and
// are skipped. The error wraps ErrInvalidRequest and names the parameter,
// or the pair's position when its key cannot be read.
func DecodeCheck(rawQuery string) (Request, error) {
	// Sized for a request Decide can take, not for what a hostile query
	// of 64 KiB of "&" would ask.
	req := Request{Descriptors: make(map[string]string, min(strings.Count(rawQuery, "&")+1, rules.MaxDescriptors))}
	var haveCost, haveID bool
	for n, off := 1, 0; off <= len(rawQuery); n++ {
		pair, _, _ := strings.Cut(rawQuery[off:], "&")
		at := off
		off += len(pair) + 1
		if pair == "" {
			continue
		}
		k, v, err := decodePair(pair)
		if err != nil {
			return Request{}, fmt.Errorf("%w: query: %w", ErrInvalidRequest, pairError(n, at, pair, err))
		}
		switch {
		case k == checkCost:
			if haveCost {
				return Request{}, fmt.Errorf("%w: query parameter %q given more than once", ErrInvalidRequest, k)
			}
			haveCost = true
			c, err := strconv.ParseFloat(v, 64)
			if err != nil || math.IsNaN(c) || math.IsInf(c, 0) {
				return Request{}, fmt.Errorf("%w: query parameter cost: %q is not a number", ErrInvalidRequest, truncate(v))
			}
			if c == 0 {
				return Request{}, fmt.Errorf("%w: query parameter cost: must be positive", ErrInvalidRequest)
			}
			req.Cost = c
		case k == checkRequestID:
			if haveID {
				return Request{}, fmt.Errorf("%w: query parameter %q given more than once", ErrInvalidRequest, k)
			}
			haveID = true
			req.RequestID = v
		case strings.EqualFold(k, checkCost) || strings.EqualFold(k, checkRequestID):
			return Request{}, fmt.Errorf("%w: query parameter %q: names are case-sensitive (%q or %q)",
				ErrInvalidRequest, k, checkCost, checkRequestID)
		default:
			if _, dup := req.Descriptors[k]; dup {
				return Request{}, fmt.Errorf("%w: query parameter %q given more than once", ErrInvalidRequest, truncate(k))
			}
			req.Descriptors[k] = v
		}
	}
	return req, nil
}

// pairProblem is why one key=value pair of a query does not decode; key
// is false when the key itself could not be read.
type pairProblem struct {
	key    bool
	name   string // the decoded key, when key is true
	reason string
}

func (p *pairProblem) Error() string { return p.reason }

// pairError names the parameter when its key decoded, else the pair's
// position (n-th pair, starting at byte at of the query) and its raw text.
func pairError(n, at int, raw string, err error) error {
	if p, ok := err.(*pairProblem); ok && p.key {
		return fmt.Errorf("parameter %q: %s", truncate(p.name), p.reason)
	}
	return fmt.Errorf("pair %d (byte %d, %q): %w", n, at, truncate(raw), err)
}

// decodePair reads one non-empty pair exactly, or says why it cannot.
func decodePair(pair string) (k, v string, err error) {
	rawK, rawV, hasEq := strings.Cut(pair, "=")
	if strings.Contains(rawK, ";") {
		return "", "", &pairProblem{reason: `key contains ";", which is not a separator: separate pairs with "&", send a ";" as %3B`}
	}
	if k, err = unescapeQuery(rawK); err != nil {
		return "", "", &pairProblem{reason: "key: " + err.Error()}
	}
	switch {
	case k == "":
		return "", "", &pairProblem{reason: "empty key"}
	case !utf8.ValidString(k):
		return "", "", &pairProblem{reason: "key is not valid UTF-8"}
	case !hasEq:
		return "", "", &pairProblem{key: true, name: k, reason: `no "=" (an empty value is written "key=")`}
	case strings.Contains(rawV, ";"):
		return "", "", &pairProblem{key: true, name: k, reason: `value contains ";", which is not a separator: separate pairs with "&", send a ";" as %3B`}
	}
	if v, err = unescapeQuery(rawV); err != nil {
		return "", "", &pairProblem{key: true, name: k, reason: "value: " + err.Error()}
	}
	if !utf8.ValidString(v) {
		return "", "", &pairProblem{key: true, name: k, reason: "value is not valid UTF-8"}
	}
	return k, v, nil
}

// unescapeQuery is url.QueryUnescape ("+" is a space) with an error that
// says where the bad escape is.
func unescapeQuery(s string) (string, error) {
	u, err := url.QueryUnescape(s)
	if err != nil {
		i := strings.IndexByte(s, '%')
		for i >= 0 && i+2 < len(s) && ishex(s[i+1]) && ishex(s[i+2]) {
			j := strings.IndexByte(s[i+3:], '%')
			if j < 0 {
				i = -1
				break
			}
			i += 3 + j
		}
		if i >= 0 {
			return "", fmt.Errorf("malformed %%-escape %q at byte %d", s[i:min(i+3, len(s))], i)
		}
		return "", err
	}
	return u, nil
}

func ishex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}
