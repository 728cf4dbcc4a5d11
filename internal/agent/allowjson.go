package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxBodyBytes bounds a POST /v1/allow body.
const MaxBodyBytes = 64 << 10

// The fields of a POST /v1/allow body, spelled as they must be.
var allowFields = [...]string{"descriptors", "rule", "subject", "cost", "request_id"}

// DecodeAllow parses a POST /v1/allow body exactly, or refuses it with an
// error wrapping ErrInvalidRequest that names the field: one JSON object
// of the documented fields, each at most once and spelled exactly (no
// case folding), strings valid UTF-8 (no invalid bytes, no lone surrogate
// escapes such as \ud800, which encoding/json would turn into U+FFFD and
// charge as such), no null (but "descriptors": null, which is the field
// left out), no duplicate descriptor, no unknown field, no trailing data,
// at most MaxBodyBytes.
func DecodeAllow(r io.Reader) (Request, error) {
	body, err := io.ReadAll(io.LimitReader(r, MaxBodyBytes+1))
	switch {
	case err != nil:
		return Request{}, fmt.Errorf("%w: body: %w", ErrInvalidRequest, err)
	case len(body) > MaxBodyBytes:
		return Request{}, fmt.Errorf("%w: body larger than %d bytes", ErrInvalidRequest, MaxBodyBytes)
	}
	p := &jsonReader{body: body, dec: json.NewDecoder(bytes.NewReader(body))}
	p.dec.UseNumber()
	req, err := p.allow()
	if err != nil {
		return Request{}, fmt.Errorf("%w: body: %w", ErrInvalidRequest, err)
	}
	return req, nil
}

// jsonReader reads tokens and, for each string, checks its raw text, which
// json.Decoder does not give: it has already replaced what is not UTF-8.
type jsonReader struct {
	body []byte
	dec  *json.Decoder
	off  int64 // where the last token ended
}

// errJSONEnd is io.EOF or io.ErrUnexpectedEOF from the decoder, reported
// as what it means for a body.
var errJSONEnd = errors.New("empty or truncated")

// next reads a token. A string comes back checked (its raw text) and as a
// string; other tokens as json.Decoder gives them.
func (p *jsonReader) next() (json.Token, error) {
	tok, err := p.dec.Token()
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, errJSONEnd
		}
		return nil, err
	}
	start, end := p.off, p.dec.InputOffset()
	p.off = end
	if s, ok := tok.(string); ok {
		raw := bytes.TrimLeft(p.body[start:end], " \t\r\n,:")
		if why := rawStringProblem(raw); why != "" {
			return nil, &stringError{s: s, at: end - int64(len(raw)), why: why}
		}
	}
	return tok, nil
}

// stringError is a string that does not decode exactly.
type stringError struct {
	s   string // as json.Decoder read it
	at  int64  // byte offset of its opening quote
	why string
}

func (e *stringError) Error() string { return e.why }

func (p *jsonReader) allow() (Request, error) {
	tok, err := p.next()
	if err != nil {
		return Request{}, err
	}
	if tok != json.Delim('{') {
		return Request{}, fmt.Errorf("want a JSON object, got %s", tokenKind(tok))
	}
	var req Request
	seen := make(map[string]bool, len(allowFields))
	for p.dec.More() {
		tok, err := p.next()
		if err != nil {
			var se *stringError
			if errors.As(err, &se) {
				return Request{}, fmt.Errorf("field name at byte %d: %s", se.at, se.why)
			}
			return Request{}, err
		}
		k := tok.(string) // json.Decoder gives only strings as keys
		if !known(k) {
			for _, f := range allowFields {
				if strings.EqualFold(k, f) {
					return Request{}, fmt.Errorf("unknown field %q: field names are case-sensitive, want %q", truncate(k), f)
				}
			}
			return Request{}, fmt.Errorf("unknown field %q", truncate(k))
		}
		if seen[k] {
			return Request{}, fmt.Errorf("field %q given more than once", k)
		}
		seen[k] = true
		switch k {
		case "descriptors":
			req.Descriptors, err = p.descriptors()
		case "rule":
			req.Rule, err = p.str(`"rule"`)
		case "subject":
			req.Subject, err = p.str(`"subject"`)
		case "request_id":
			req.RequestID, err = p.str(`"request_id"`)
		case "cost":
			req.Cost, err = p.cost()
		}
		if err != nil {
			return Request{}, err
		}
	}
	if _, err := p.next(); err != nil { // the closing brace
		return Request{}, err
	}
	if _, err := p.dec.Token(); !errors.Is(err, io.EOF) {
		return Request{}, errors.New("trailing data after the JSON object")
	}
	return req, nil
}

func known(k string) bool {
	for _, f := range allowFields {
		if k == f {
			return true
		}
	}
	return false
}

// str reads the string value of field (its name as errors give it).
func (p *jsonReader) str(field string) (string, error) {
	tok, err := p.next()
	if err != nil {
		var se *stringError
		if errors.As(err, &se) {
			return "", fmt.Errorf("field %s: %s", field, se.why)
		}
		return "", fmt.Errorf("field %s: %w", field, err)
	}
	s, ok := tok.(string)
	if !ok {
		return "", fmt.Errorf("field %s: want a string, got %s", field, tokenKind(tok))
	}
	return s, nil
}

// cost reads cost: a positive number (absent means 1, so 0 is an error).
func (p *jsonReader) cost() (float64, error) {
	tok, err := p.next()
	if err != nil {
		return 0, fmt.Errorf("field \"cost\": %w", err)
	}
	n, ok := tok.(json.Number)
	if !ok {
		return 0, fmt.Errorf("field \"cost\": want a number, got %s", tokenKind(tok))
	}
	c, err := strconv.ParseFloat(string(n), 64)
	if err != nil {
		return 0, fmt.Errorf("field \"cost\": %s is out of range", truncate(string(n)))
	}
	if c <= 0 {
		return 0, fmt.Errorf("field \"cost\": %v must be positive", c)
	}
	return c, nil
}

// descriptors reads the descriptors object: string keys, each once, to
// string values; or null.
func (p *jsonReader) descriptors() (map[string]string, error) {
	tok, err := p.next()
	if err != nil {
		return nil, fmt.Errorf("field \"descriptors\": %w", err)
	}
	switch {
	case tok == nil:
		// What encoding/json writes for a nil map: no descriptors, as when
		// the field is left out (a null descriptor value is an error).
		return nil, nil
	case tok != json.Delim('{'):
		return nil, fmt.Errorf("field \"descriptors\": want an object of strings, got %s", tokenKind(tok))
	}
	d := make(map[string]string)
	for p.dec.More() {
		tok, err := p.next()
		if err != nil {
			var se *stringError
			if errors.As(err, &se) {
				return nil, fmt.Errorf("field \"descriptors\": key at byte %d: %s", se.at, se.why)
			}
			return nil, fmt.Errorf("field \"descriptors\": %w", err)
		}
		k := tok.(string)
		if _, dup := d[k]; dup {
			return nil, fmt.Errorf("field \"descriptors\": key %q given more than once", truncate(k))
		}
		if d[k], err = p.str(fmt.Sprintf("descriptors[%q]", truncate(k))); err != nil {
			return nil, err
		}
	}
	if _, err := p.next(); err != nil {
		return nil, fmt.Errorf("field \"descriptors\": %w", err)
	}
	return d, nil
}

// tokenKind names what a token is, for errors.
func tokenKind(tok json.Token) string {
	switch t := tok.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case json.Number:
		return "a number"
	case string:
		return "a string"
	case json.Delim:
		if t == '{' {
			return "an object"
		}
		return "an array"
	}
	return fmt.Sprintf("%T", tok)
}

// rawStringProblem checks a JSON string's raw text (quotes included, as
// json.Decoder accepted it): every byte UTF-8, every \u escape a
// character, not half of a surrogate pair.
func rawStringProblem(raw []byte) string {
	if !utf8.Valid(raw) {
		i := 0
		for i < len(raw) {
			r, n := utf8.DecodeRune(raw[i:])
			if r == utf8.RuneError && n == 1 {
				break
			}
			i += n
		}
		return fmt.Sprintf("not valid UTF-8 (byte %#x at byte %d of the string)", raw[i], i)
	}
	for i := 0; i < len(raw); i++ {
		if raw[i] != '\\' {
			continue
		}
		i++
		if raw[i] != 'u' {
			continue
		}
		r := hex4(raw[i+1 : i+5])
		i += 4
		switch {
		case 0xDC00 <= r && r <= 0xDFFF:
			return fmt.Sprintf(`lone surrogate escape \u%04x (not a character)`, r)
		case 0xD800 <= r && r <= 0xDBFF:
			if i+6 < len(raw) && raw[i+1] == '\\' && raw[i+2] == 'u' {
				if lo := hex4(raw[i+3 : i+7]); 0xDC00 <= lo && lo <= 0xDFFF {
					i += 6
					continue
				}
			}
			return fmt.Sprintf(`lone surrogate escape \u%04x (not a character)`, r)
		}
	}
	return ""
}

// hex4 reads four hex digits, which json.Decoder has checked.
func hex4(b []byte) rune {
	var r rune
	for _, c := range b {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		default:
			c -= 'A' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}
