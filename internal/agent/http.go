package agent

import (
	"encoding/json"
	"net/http"

	"github.com/ration-dev/ration/client/header"
)

// answerJSON is the answer of POST /v1/allow.
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
	req, err := DecodeCheck(r.URL.RawQuery)
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
