// Package tokenfile serves a bearer token read from a file: the
// coordinator's admin token (-admin-token-file), for deployments without a
// PKI, or on top of one. Like internal/tlsfiles, the file is read again
// every few seconds and a changed token is put in force without a restart;
// a read that fails, or a file that holds no usable token (empty, too
// short, or changed in place without its final newline: half-written
// during a rotation), keeps the token in force and is logged once per
// content.
//
// Presented tokens are compared in constant time (over their SHA-256
// digests, so that neither the content nor the length leaks through
// timing). On the wire the token travels as gRPC metadata
// "authorization: Bearer <token>" (PerRPCCredentials): in plaintext
// (-insecure) anyone on the path can read it.
package tokenfile

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/credentials"
)

// MinLen is the shortest token accepted: 16 bytes of random text (say
// `openssl rand -hex 16`, or `head -c 24 /dev/urandom | base64`) cannot be
// guessed; "secret" can.
const MinLen = 16

// DefaultInterval is how often the file is checked for a change.
const DefaultInterval = 5 * time.Second

// MetadataKey and Scheme are how a call carries the token:
// "authorization: Bearer <token>".
const (
	MetadataKey = "authorization"
	Scheme      = "Bearer"
)

// Read reads a token file once: its content without surrounding white
// space (a trailing newline is how editors and echo leave it). A token
// shorter than MinLen, or with white space or control characters inside,
// is an error.
func Read(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("tokenfile: %w", err)
	}
	return parse(path, b)
}

func parse(path string, b []byte) (string, error) {
	tok := strings.TrimSpace(string(b))
	switch {
	case tok == "":
		return "", fmt.Errorf("tokenfile: %s is empty", path)
	case len(tok) < MinLen:
		return "", fmt.Errorf("tokenfile: %s holds a token of %d bytes, want at least %d", path, len(tok), MinLen)
	case strings.ContainsFunc(tok, func(r rune) bool { return r <= ' ' || r == 0x7f }):
		return "", fmt.Errorf("tokenfile: %s: the token holds white space or control characters (one line, one token)", path)
	}
	return tok, nil
}

// Token is the token in force and its reloading. Its methods are safe for
// concurrent use.
type Token struct {
	path     string
	logger   *slog.Logger
	interval time.Duration

	cur       atomic.Pointer[token]
	mu        sync.Mutex
	file      os.FileInfo // the file as last read, to tell a rename from a write in place
	failedMsg string      // the last failure logged, logged once
	reloads   atomic.Int64
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

type token struct {
	value string
	sum   [32]byte
}

// Options tune a Token. The zero value is usable.
type Options struct {
	Logger   *slog.Logger  // reloads and reload failures (default: discarded)
	Interval time.Duration // how often the file is checked (default DefaultInterval)
}

// Open reads the file (an error here is fatal: there is no older token to
// keep) and starts checking it for changes every opts.Interval. Close
// stops that.
func Open(path string, opts Options) (*Token, error) {
	if path == "" {
		return nil, errors.New("tokenfile: no file named")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	v, err := Read(path)
	if err != nil {
		return nil, err
	}
	t := &Token{path: path, logger: opts.Logger, interval: opts.Interval, stop: make(chan struct{}), done: make(chan struct{})}
	t.file, _ = os.Stat(path)
	t.cur.Store(&token{value: v, sum: sha256.Sum256([]byte(v))})
	t.logger.Info("admin token loaded", "file", path)
	go t.poll()
	return t, nil
}

// Close stops the reloading; the token in force stays.
func (t *Token) Close() {
	t.closeOnce.Do(func() { close(t.stop); <-t.done })
}

func (t *Token) poll() {
	defer close(t.done)
	tick := time.NewTicker(t.interval)
	defer tick.Stop()
	for {
		select {
		case <-t.stop:
			return
		case <-tick.C:
			_, _ = t.Reload()
		}
	}
}

// Reload reads the file now and puts its token in force when it changed
// and is usable. It reports whether a new token is in force; an error
// leaves the old one in force (and is logged once per failure).
func (t *Token) Reload() (bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	v, err := t.read()
	if err != nil {
		if msg := err.Error(); msg != t.failedMsg {
			t.failedMsg = msg
			t.logger.Error("admin token file could not be reloaded; the token in force stays", "file", t.path, "err", err)
		}
		return false, err
	}
	t.failedMsg = ""
	sum := sha256.Sum256([]byte(v))
	if sum == t.cur.Load().sum {
		return false, nil
	}
	t.cur.Store(&token{value: v, sum: sum})
	t.reloads.Add(1)
	t.logger.Info("admin token reloaded", "file", t.path)
	return true, nil
}

// ErrIncomplete marks a token file changed in place whose content does
// not end in a newline: it may be half written.
var ErrIncomplete = errors.New("tokenfile: incomplete")

// read reads the file for Reload. A new content is taken only when it is
// complete: it ends in a newline (echo, editors), or the file was replaced
// (a rename over it, a secret volume's symlink swap), which writes it
// whole. Written in place, a file is read while it is being written: its
// first bytes, 16 or more, would pass for a token, and the token in force
// would be one nobody holds.
func (t *Token) read() (string, error) {
	fi, err := os.Stat(t.path)
	if err != nil {
		return "", fmt.Errorf("tokenfile: %w", err)
	}
	b, err := os.ReadFile(t.path)
	if err != nil {
		return "", fmt.Errorf("tokenfile: %w", err)
	}
	replaced := t.file == nil || !os.SameFile(fi, t.file)
	t.file = fi
	v, err := parse(t.path, b)
	if err != nil {
		return "", err
	}
	if !replaced && !bytes.HasSuffix(b, []byte("\n")) && sha256.Sum256([]byte(v)) != t.cur.Load().sum {
		return "", fmt.Errorf("%w: %s changed in place and does not end in a newline (it may be half written): end the token with a newline, or rename a new file over it", ErrIncomplete, t.path)
	}
	return v, nil
}

// Reloads counts the tokens put in force after Open.
func (t *Token) Reloads() int64 { return t.reloads.Load() }

// Value returns the token in force (for a client that sends it).
func (t *Token) Value() string { return t.cur.Load().value }

// Match reports, in constant time, whether presented is the token in force.
func (t *Token) Match(presented string) bool {
	sum := sha256.Sum256([]byte(presented))
	want := t.cur.Load().sum
	return subtle.ConstantTimeCompare(sum[:], want[:]) == 1
}

// FromHeader returns the token of an "authorization" value: "Bearer
// <token>" (the scheme is case-insensitive, as in HTTP).
func FromHeader(v string) (string, bool) {
	scheme, tok, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, Scheme) {
		return "", false
	}
	return strings.TrimSpace(tok), true
}

// PerRPCCredentials send the token in force with every call.
func (t *Token) PerRPCCredentials() credentials.PerRPCCredentials {
	return bearer(t.Value)
}

// Bearer sends a fixed token with every call (a command that runs once).
func Bearer(tok string) credentials.PerRPCCredentials {
	return bearer(func() string { return tok })
}

type bearer func() string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{MetadataKey: Scheme + " " + b()}, nil
}

// RequireTransportSecurity is false: a token may be the only protection
// of a plaintext admin listener (-insecure), which is the operator's
// choice (docs/security.md says what it exposes).
func (bearer) RequireTransportSecurity() bool { return false }
