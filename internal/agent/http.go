package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/ration-dev/ration/internal/header"
)

// MaxBodyBytes bounds a POST /v1/allow body.
const MaxBodyBytes = 64 << 10

// allowJSON is the body of POST /v1/allow.
type allowJSON struct {
	Descriptors map[string]string `json:"descriptors,omitempty"`
	Rule        string            `json:"rule,omitempty"`
	Subject     string            `json:"subject,omitempty"`
	Cost        *float64          `json:"cost,omitempty"` // absent means 1; 0 is an error
	RequestID   string            `json:"request_id,omitempty"`
}

// answerJSON is its answer.
type answerJSON struct {
	Allowed      bool    `json:"allowed"`
	RetryAfterMs int64   `json:"retry_after_ms"`
	Remaining    int64   `json:"remaining"`
	Limit        int64   `json:"limit"`
	Rate         float64 `json:"rate"`
	ResetMs      int64   `json:"reset_ms"`
	Rule         string  `json:"rule,omitempty"`
	Reason       string  `json:"reason"`
}

type errorJSON struct {
	Error string `json:"error"`
}

// DecodeAllow parses a POST /v1/allow body strictly: unknown fields,
// trailing data and oversized bodies are errors wrapping ErrInvalidRequest.
func DecodeAllow(r io.Reader) (Request, error) {
	dec := json.NewDecoder(io.LimitReader(r, MaxBodyBytes+1))
	dec.DisallowUnknownFields()
	var in allowJSON
	if err := dec.Decode(&in); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return Request{}, fmt.Errorf("%w: body is empty, truncated or larger than %d bytes", ErrInvalidRequest, MaxBodyBytes)
		}
		return Request{}, fmt.Errorf("%w: body: %w", ErrInvalidRequest, err)
	}
	if dec.More() {
		return Request{}, fmt.Errorf("%w: body: trailing data after the JSON object", ErrInvalidRequest)
	}
	if dec.InputOffset() > MaxBodyBytes {
		return Request{}, fmt.Errorf("%w: body larger than %d bytes", ErrInvalidRequest, MaxBodyBytes)
	}
	req := Request{Descriptors: in.Descriptors, Rule: in.Rule, Subject: in.Subject, RequestID: in.RequestID}
	if in.Cost != nil {
		if *in.Cost <= 0 {
			return Request{}, fmt.Errorf("%w: cost %v must be positive", ErrInvalidRequest, *in.Cost)
		}
		req.Cost = *in.Cost
	}
	return req, nil
}

// DecodeCheck turns a check URL's query into a request: every parameter is a
// descriptor except cost and request_id. A repeated parameter is an error
// (which value would be meant is ambiguous).
func DecodeCheck(q map[string][]string) (Request, error) {
	req := Request{Descriptors: make(map[string]string, len(q))}
	for k, vs := range q {
		if len(vs) != 1 {
			return Request{}, fmt.Errorf("%w: query parameter %q given %d times", ErrInvalidRequest, truncate(k), len(vs))
		}
		switch k {
		case "cost":
			c, err := strconv.ParseFloat(vs[0], 64)
			if err != nil {
				return Request{}, fmt.Errorf("%w: cost %q is not a number", ErrInvalidRequest, truncate(vs[0]))
			}
			if c == 0 {
				return Request{}, fmt.Errorf("%w: cost must be positive", ErrInvalidRequest)
			}
			req.Cost = c
		case "request_id":
			req.RequestID = vs[0]
		default:
			req.Descriptors[k] = vs[0]
		}
	}
	return req, nil
}

func (s *Service) handleAllow(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeJSON(w, http.StatusMethodNotAllowed, errorJSON{Error: "use POST"})
		return
	}
	req, err := DecodeAllow(http.MaxBytesReader(w, r.Body, MaxBodyBytes+1))
	if err != nil {
		s.metrics.invalid.Inc()
		writeJSON(w, http.StatusBadRequest, errorJSON{Error: err.Error()})
		return
	}
	resp, err := s.Decide(r.Context(), req)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, errorJSON{Error: err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, answerJSON{
		Allowed:      resp.Allowed,
		RetryAfterMs: ceilMillis(resp.RetryAfter),
		Remaining:    floorInt(resp.Remaining),
		Limit:        floorInt(resp.Limit),
		Rate:         resp.Rate,
		ResetMs:      ceilMillis(resp.Reset),
		Rule:         resp.Rule,
		Reason:       resp.Reason.String(),
	})
}

// handleCheck answers gateways that delegate a check: 200 admitted, 429 quota
// spent, 503 limiter unreachable under fail_closed, 400 bad request.
func (s *Service) handleCheck(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "use GET", http.StatusMethodNotAllowed)
		return
	}
	req, err := DecodeCheck(r.URL.Query())
	if err != nil {
		s.metrics.invalid.Inc() // Decide counts the requests it refuses itself
	} else {
		var resp Response
		resp, err = s.Decide(r.Context(), req)
		if err == nil {
			code := CheckStatus(resp)
			switch {
			case code == http.StatusServiceUnavailable:
				// The quota is not spent; the limiter is unreachable. A short
				// wait is the honest advice, and no bucket was read.
				header.Unavailable(w.Header())
			case resp.Reason == ReasonUnavailable:
				// Admitted by fail_open: no bucket was read, so no quota
				// fields (they would claim r=0).
			case resp.Rule != "":
				header.Set(w.Header(), header.Quota{
					Policy: resp.Rule, Limit: resp.Limit, Rate: resp.Rate,
					Remaining: resp.Remaining, Reset: resp.Reset, RetryAfter: resp.RetryAfter,
				})
			}
			w.Header().Set("X-Ration-Reason", resp.Reason.String())
			w.WriteHeader(code)
			return
		}
	}
	http.Error(w, err.Error(), http.StatusBadRequest)
}

// CheckStatus maps a decision to the check endpoint's HTTP status.
func CheckStatus(resp Response) int {
	switch {
	case resp.Allowed:
		return http.StatusOK
	case resp.Reason == ReasonUnavailable:
		return http.StatusServiceUnavailable
	default:
		return http.StatusTooManyRequests
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
