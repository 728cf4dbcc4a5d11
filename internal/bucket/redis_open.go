package bucket

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// OpenRedis returns a pooled client for spec, which takes one of these forms:
//
//	host:port
//	    one Redis server, database 0.
//	redis://[user:password@]host:port[/db]
//	    one Redis server; db is the database number (default 0).
//	redis-sentinel://[user:password@]host:port[,host:port...]/master-name
//	    the primary that the listed Sentinels name master-name, followed
//	    through failovers; user and password are for the Redis servers, the
//	    Sentinels are reached without them.
//	redis-cluster://[user:password@]host:port[,host:port...]
//	    a Redis Cluster; the listed nodes are seeds, the rest is discovered.
//
// rediss://, rediss-sentinel:// and rediss-cluster:// are the same over TLS
// (Sentinels and servers alike), verified as RedisTLS says. A Sentinel
// form takes ?sentinel_username=U&sentinel_password=P for Sentinels that
// require a password of their own (the user:password part is the Redis
// servers'); they are the only query parameters.
//
// A user or password containing '%', ':', '@', '/', '?', '#', '&' or ','
// must be percent-encoded (%25, %3A, %40, %2F, %3F, %23, %26, %2C). IPv6
// hosts go in brackets: [::1]:6379.
//
// timeout (> 0) bounds dialling, each read and write, and waiting for a
// pooled connection; the client also honours context deadlines. Decisions go
// to primaries only: replicas are never read, and Cluster routing is by slot
// owner (no latency or random routing). OpenRedis does no I/O; an error names
// the part of spec that is wrong (user information and secret query
// parameters are never echoed, however malformed: see redactSpec).
func OpenRedis(spec string, timeout time.Duration) (redis.UniversalClient, error) {
	return OpenRedisTLS(spec, timeout, RedisTLS{})
}

// RedisTLS is how a rediss:// connection is verified and authenticated.
// The zero value verifies the server against the system's roots and the
// host dialed (a host name or an IP address), and presents no client
// certificate.
type RedisTLS struct {
	CA        string // PEM CA bundle the servers' certificates chain to (empty: system roots)
	Cert, Key string // PEM client certificate and key, for tls-auth-clients yes (both or neither)
	// ServerName is the name every server's certificate must carry,
	// Sentinels, primaries and Cluster nodes alike (empty: the host dialed,
	// an IP address checked against the certificate's IP SANs).
	ServerName string
}

// Enabled reports whether any field is set.
func (t RedisTLS) Enabled() bool { return t != RedisTLS{} }

// redisTLSDialer makes the TLS connections of a rediss:// client. It dials
// itself, rather than handing go-redis a tls.Config, because the name a
// server's certificate is checked against must be known for each
// connection: crypto/tls tells a verification callback only the SNI it
// sent, and it sends none for an IP address, so a callback that checked
// that name checked nothing when Sentinel or Cluster handed out a server by
// IP. Here the name is the ServerName setting or else the host dialled,
// IP addresses included (checked against the certificate's IP SANs), and
// a connection with no name to check is refused.
type redisTLSDialer struct {
	t       RedisTLS
	files   *redisTLSFiles
	timeout time.Duration
}

// newRedisTLSDialer reads the files now (so that a bad file is an error at
// start-up) and again, for new connections, when they change: cert-manager
// and other rotators replace them in place, and a connection made after
// the rotation must present the new client certificate and trust the new
// CA without a restart. Connections already open keep the material they
// were made with.
func newRedisTLSDialer(t RedisTLS, timeout time.Duration) (*redisTLSDialer, error) {
	if (t.Cert == "") != (t.Key == "") {
		return nil, errors.New("redis TLS: a client certificate needs both its certificate and its key")
	}
	if t.ServerName != "" {
		if err := checkServerName(t.ServerName); err != nil {
			return nil, err
		}
	}
	d := &redisTLSDialer{t: t, files: &redisTLSFiles{t: t, interval: time.Second}, timeout: timeout}
	if _, err := d.files.current(); err != nil {
		return nil, err
	}
	return d, nil
}

// checkServerName refuses a -redis-tls-server-name that no certificate can
// match, so that a typo is an error at start-up rather than every
// handshake failing.
func checkServerName(name string) error {
	if strings.ContainsAny(name, " /:@?#") && net.ParseIP(name) == nil {
		return fmt.Errorf("redis TLS: server name %q is not a host name or IP address", name)
	}
	return nil
}

// config is the tls.Config of one connection, whose server certificate must
// name name (a DNS name, or an IP address matched against IP SANs).
func (d *redisTLSDialer) config(name string) *tls.Config {
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: name}
	if d.t.Cert != "" {
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			m, err := d.files.current()
			if err != nil {
				return nil, err
			}
			return m.cert, nil
		}
	}
	if d.t.CA == "" {
		// crypto/tls verifies the chain against the system's roots and
		// ServerName against the certificate, IP SANs included.
		return c
	}
	// The roots can change, so the chain is verified here against the
	// current ones rather than by crypto/tls against a pool fixed now.
	// InsecureSkipVerify only moves the check: VerifyConnection runs on
	// every handshake and checks the chain and name itself.
	c.InsecureSkipVerify = true
	c.VerifyConnection = func(cs tls.ConnectionState) error {
		m, err := d.files.current()
		if err != nil {
			return err
		}
		if len(cs.PeerCertificates) == 0 {
			return errors.New("redis TLS: the server sent no certificate")
		}
		inter := x509.NewCertPool()
		for _, ic := range cs.PeerCertificates[1:] {
			inter.AddCert(ic)
		}
		_, err = cs.PeerCertificates[0].Verify(x509.VerifyOptions{
			DNSName: name, Roots: m.roots, Intermediates: inter,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		})
		if err != nil {
			return fmt.Errorf("redis TLS: server certificate: %w", err)
		}
		return nil
	}
	return c
}

// dial is the go-redis Dialer of every connection of the client: to the
// servers listed, to Sentinels, and to the primaries and Cluster nodes they
// name.
func (d *redisTLSDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	name := d.t.ServerName
	if name == "" {
		host, _, err := net.SplitHostPort(addr)
		if err != nil || host == "" {
			// x509 checks no name when given none: refuse rather than
			// trust any certificate of the CA.
			return nil, fmt.Errorf("redis TLS: %q has no host to verify the server's certificate against (set -redis-tls-server-name)", addr)
		}
		name = host
	}
	// go-redis's pool bounds each dial by its client's DialTimeout (and
	// the command's deadline), so the bound here is for a dial without
	// one: a second one would cap the patient clients of a warm-up
	// (loadScriptsOn, DialTimeout the warm-up budget) at the decision
	// timeout, too short for a TLS handshake over a slow link.
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d.timeout)
		defer cancel()
	}
	// The keep-alives of go-redis's own dialer, which this replaces: a
	// silently dead server is noticed within a minute.
	nd := &net.Dialer{KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: 30 * time.Second, Interval: 5 * time.Second, Count: 3}}
	raw, err := nd.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	conn := tls.Client(raw, d.config(name))
	if err := conn.HandshakeContext(ctx); err != nil {
		_ = raw.Close()
		return nil, err
	}
	return conn, nil
}

// redisTLSFiles is the CA and client certificate of a rediss:// client,
// reread when the files change (checked at most every interval, on a
// handshake: new connections are rare, so no timer is needed).
type redisTLSFiles struct {
	t        RedisTLS
	interval time.Duration

	mu      sync.Mutex
	checked time.Time
	sum     [32]byte
	m       *redisTLSMaterial
}

type redisTLSMaterial struct {
	roots *x509.CertPool   // nil: the system's
	cert  *tls.Certificate // nil: none
}

// current returns the material, reloaded when a file changed. A file that
// no longer parses (half written by a rotator) keeps the last good
// material, so a rotation in progress does not refuse connections; with
// none yet, it is the error.
func (f *redisTLSFiles) current() (*redisTLSMaterial, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m != nil && time.Since(f.checked) < f.interval {
		return f.m, nil
	}
	f.checked = time.Now()
	raw, sum, err := f.read()
	if err == nil && f.m != nil && sum == f.sum {
		return f.m, nil
	}
	var m *redisTLSMaterial
	if err == nil {
		m, err = f.parse(raw)
	}
	if err != nil {
		if f.m != nil {
			return f.m, nil
		}
		return nil, err
	}
	f.m, f.sum = m, sum
	return m, nil
}

func (f *redisTLSFiles) read() (raw [3][]byte, sum [32]byte, err error) {
	h := sha256.New()
	for i, path := range []string{f.t.CA, f.t.Cert, f.t.Key} {
		if path == "" {
			continue
		}
		if raw[i], err = os.ReadFile(path); err != nil {
			return raw, sum, fmt.Errorf("redis TLS: %w", err)
		}
		h.Write(raw[i])
		h.Write([]byte{0})
	}
	copy(sum[:], h.Sum(nil))
	return raw, sum, nil
}

func (f *redisTLSFiles) parse(raw [3][]byte) (*redisTLSMaterial, error) {
	m := &redisTLSMaterial{}
	if f.t.CA != "" {
		m.roots = x509.NewCertPool()
		if !m.roots.AppendCertsFromPEM(raw[0]) {
			return nil, fmt.Errorf("redis TLS CA %s: no PEM certificate", f.t.CA)
		}
	}
	if f.t.Cert != "" {
		cert, err := tls.X509KeyPair(raw[1], raw[2])
		if err != nil {
			return nil, fmt.Errorf("redis TLS client certificate %s: %w", f.t.Cert, err)
		}
		m.cert = &cert
	}
	return m, nil
}

// OpenRedisTLS is OpenRedis with the TLS settings of rediss:// forms. TLS
// settings with a plaintext form are an error: they would be ignored.
func OpenRedisTLS(spec string, timeout time.Duration, tlsOpts RedisTLS) (redis.UniversalClient, error) {
	if timeout <= 0 {
		return nil, fmt.Errorf("bucket: redis timeout %v must be positive", timeout)
	}
	a, err := parseRedisSpec(spec)
	if err != nil {
		return nil, specError(spec, err)
	}
	o := &redis.UniversalOptions{
		Addrs:        a.addrs,
		MasterName:   a.master,
		Username:     a.user,
		Password:     a.password,
		DB:           a.db,
		DialTimeout:  timeout,
		ReadTimeout:  timeout,
		WriteTimeout: timeout,
		PoolTimeout:  timeout,
		// One dial per attempt: go-redis's default dial retries wait 100ms
		// between tries, longer than a decision's whole timeout (50ms by
		// default), so against a dead node they only made every decision
		// that needed a connection wait its timeout out, and kept its
		// breaker from hearing of the failure. A refused dial now fails at
		// once; command retries, and the breaker's prober, try again.
		DialerRetries:         1,
		ContextTimeoutEnabled: true,
		SentinelUsername:      a.sentinelUser,
		SentinelPassword:      a.sentinelPassword,
	}
	switch {
	case a.tls:
		d, err := newRedisTLSDialer(tlsOpts, timeout)
		if err != nil {
			return nil, fmt.Errorf("bucket: %w", err)
		}
		o.Dialer = d.dial
		// go-redis reads TLSConfig only to know that the endpoint is TLS;
		// every connection is made by the Dialer. Should a path of
		// go-redis ever dial with it, it verifies against the system's
		// roots and the host dialled, and fails closed.
		o.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	case tlsOpts.Enabled():
		return nil, fmt.Errorf("bucket: redis address %q: TLS settings given for a plaintext address (use rediss://)", redactSpec(spec))
	}
	switch a.kind {
	case "sentinel":
		return redis.NewFailoverClient(o.Failover()), nil
	case "cluster":
		return redis.NewClusterClient(o.Cluster()), nil
	default:
		return redis.NewClient(o.Simple()), nil
	}
}

type redisSpec struct {
	kind                           string // "single", "sentinel", "cluster"
	tls                            bool   // rediss, rediss-sentinel, rediss-cluster
	addrs                          []string
	user, password                 string
	sentinelUser, sentinelPassword string
	db                             int
	master                         string
}

func parseRedisSpec(spec string) (redisSpec, error) {
	var a redisSpec
	scheme, rest, ok := strings.Cut(spec, "://")
	if !ok {
		if err := checkHostPort(spec); err != nil {
			return a, fmt.Errorf("%w (want host:port, redis://, redis-sentinel:// or redis-cluster://)", err)
		}
		a.kind, a.addrs = "single", []string{spec}
		return a, nil
	}
	if s, ok := strings.CutPrefix(scheme, "rediss"); ok {
		a.tls, scheme = true, "redis"+s
	}
	switch scheme {
	case "redis":
		a.kind = "single"
	case "redis-sentinel":
		a.kind = "sentinel"
	case "redis-cluster":
		a.kind = "cluster"
	default:
		return a, fmt.Errorf("scheme %q is not supported (want redis://, redis-sentinel:// or redis-cluster://, or rediss... for TLS)", scheme)
	}
	if strings.Contains(rest, "#") {
		return a, errors.New("fragments are not supported")
	}
	rest, query, hasQuery := strings.Cut(rest, "?")
	if hasQuery {
		if a.kind != "sentinel" {
			return a, errors.New("query parameters are only for Sentinel forms (sentinel_username, sentinel_password)")
		}
		q, err := url.ParseQuery(query)
		if err != nil {
			return a, fmt.Errorf("%w: the query is not valid percent-encoding", ErrRedisCredentials)
		}
		for k, v := range q {
			var dst *string
			switch k {
			case "sentinel_username":
				dst = &a.sentinelUser
			case "sentinel_password":
				dst = &a.sentinelPassword
			default:
				return a, fmt.Errorf("query parameter %q is not supported (want sentinel_username, sentinel_password)", k)
			}
			if len(v) != 1 {
				return a, fmt.Errorf("%w: query parameter %s given %d times", ErrRedisCredentials, k, len(v))
			}
			*dst = v[0]
		}
	}
	authority, path, _ := strings.Cut(rest, "/")
	if i := strings.LastIndex(authority, "@"); i >= 0 {
		userinfo := authority[:i]
		authority = authority[i+1:]
		user, pass, hasPass := strings.Cut(userinfo, ":")
		var err error
		if a.user, err = url.PathUnescape(user); err != nil {
			return a, fmt.Errorf("%w: the user is not valid percent-encoding", ErrRedisCredentials)
		}
		if hasPass {
			if a.password, err = url.PathUnescape(pass); err != nil {
				return a, fmt.Errorf("%w: the password is not valid percent-encoding", ErrRedisCredentials)
			}
		}
	}
	if authority == "" {
		return a, errors.New("no host:port after the scheme")
	}
	a.addrs = strings.Split(authority, ",")
	for _, hp := range a.addrs {
		if err := checkHostPort(hp); err != nil {
			return a, err
		}
	}
	switch a.kind {
	case "single":
		if len(a.addrs) > 1 {
			return a, fmt.Errorf("redis:// takes one host:port, got %d (use redis-cluster:// or redis-sentinel:// for several)", len(a.addrs))
		}
		if path != "" {
			db, err := strconv.Atoi(path)
			if err != nil || db < 0 {
				return a, fmt.Errorf("database %q after '/' must be a number >= 0", path)
			}
			a.db = db
		}
	case "sentinel":
		if path == "" {
			return a, errors.New("missing master name: redis-sentinel://host:port[,host:port...]/master-name")
		}
		if strings.Contains(path, "/") {
			return a, fmt.Errorf("master name %q must not contain '/'", path)
		}
		a.master = path
	case "cluster":
		if path != "" {
			return a, fmt.Errorf("unexpected %q after '/': a cluster has only database 0", path)
		}
	}
	return a, nil
}

func checkHostPort(hp string) error {
	host, port, err := net.SplitHostPort(hp)
	if err != nil {
		return fmt.Errorf("%q is not host:port", hp)
	}
	if host == "" {
		return fmt.Errorf("%q has no host", hp)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port %q in %q must be a number in 1..65535", port, hp)
	}
	return nil
}

// redacted stands for a secret in what is printed.
const redacted = "xxxxx"

// RedactRedisSpec is spec, an OpenRedis address, as it may be printed: its
// user information and secret query parameters replaced by xxxxx,
// however malformed it is.
func RedactRedisSpec(spec string) string { return redactSpec(spec) }

// redactSpec is spec as it may be printed: without its user information or
// any secret query parameter, whatever characters they hold. A malformed
// spec is the one to print (it is what the operator must fix), so this
// reads spec by its delimiters alone, both ways a stray delimiter can be
// read, and hides what either reading calls a secret: the user information
// as the parser reads it (before the '@' of the part before the first
// '?') and as a URL with an unencoded '?' or '/' in its password would
// (before the last '@'), and, from the value of the first query parameter
// naming a password, user, secret, token or key, everything after it (its
// value may hold an unencoded '&' or '#'). The user name goes too: which
// part is the user is itself a guess when a delimiter is astray, and a
// lone password is often written where the user goes (redis://secret@h).
func redactSpec(spec string) string {
	start := 0
	if i := strings.Index(spec, "://"); i >= 0 {
		start = i + len("://")
	}
	hide := make([]bool, len(spec))
	hideFrom := func(from, to int) {
		for i := from; i < to; i++ {
			hide[i] = true
		}
	}
	q := strings.IndexByte(spec[start:], '?')
	if q < 0 {
		q = len(spec)
	} else {
		q += start
	}
	if at := strings.LastIndexByte(spec[start:q], '@'); at >= 0 {
		hideFrom(start, start+at)
	}
	if at := strings.LastIndexByte(spec[start:], '@'); at >= 0 && start+at > q {
		hideFrom(start, start+at)
	}
	if q < len(spec) {
		off := q + 1
		for _, kv := range strings.Split(spec[q+1:], "&") {
			if k, _, hasValue := strings.Cut(kv, "="); secretParam(k) {
				if hasValue {
					off += len(k) + 1
				}
				hideFrom(off, len(spec))
				break
			}
			off += len(kv) + 1
		}
	}
	var b strings.Builder
	for i := 0; i < len(spec); i++ {
		if !hide[i] {
			b.WriteByte(spec[i])
		} else if i == 0 || !hide[i-1] {
			b.WriteString(redacted)
		}
	}
	return b.String()
}

// secretParam reports whether query parameter k may carry a credential.
func secretParam(k string) bool {
	if u, err := url.QueryUnescape(k); err == nil {
		k = u
	}
	k = strings.ToLower(k)
	for _, w := range []string{"pass", "user", "secret", "token", "auth", "key"} {
		if strings.Contains(k, w) {
			return true
		}
	}
	return false
}

// specError is the error of a spec that does not parse. Its message
// quotes parts of spec, which, where the delimiters are not where they
// should be, can be pieces of a password: so, unless it is one of the
// parser's errors about credentials (which quote nothing of them), it is
// the error of the redacted spec, and when that parses (the fault was in
// what redaction hides) ErrRedisCredentials with how to encode them.
func specError(spec string, err error) error {
	red := redactSpec(spec)
	switch _, rerr := parseRedisSpec(red); {
	case red == spec || errors.Is(err, ErrRedisCredentials):
	case rerr != nil:
		err = rerr
	default:
		err = fmt.Errorf("%w in what is hidden as %s: percent-encode '%%', ':', '@', '/', '?', '#', '&' and ',' in the user, password and query values (%%25 %%3A %%40 %%2F %%3F %%23 %%26 %%2C); "+
			"the query takes only sentinel_username and sentinel_password", ErrRedisCredentials, redacted)
	}
	return fmt.Errorf("bucket: redis address %q: %w", red, err)
}

// ErrRedisCredentials is the error of a Redis address whose user
// information or secret query parameters do not parse.
var ErrRedisCredentials = errors.New("malformed credentials")

// CheckEviction reads maxmemory-policy (CONFIG GET; on every master of a
// Cluster) and returns it with a warning, empty only for noeviction. Buckets
// that Redis evicts come back full: budget returned early, silently.
//
// For a Cluster whose masters disagree, policy lists "addr=policy" for each,
// sorted. An error means the policy could not be read (CONFIG may be renamed
// or forbidden on managed Redis); the caller should then warn that it could
// not check.
func CheckEviction(ctx context.Context, c redis.UniversalClient) (policy string, warning string, err error) {
	var mu sync.Mutex
	byNode := map[string]string{}
	err = eachMaster(ctx, c, func(ctx context.Context, addr string, n redis.Cmdable) error {
		m, err := n.ConfigGet(ctx, "maxmemory-policy").Result()
		if err != nil {
			return err
		}
		p, ok := m["maxmemory-policy"]
		if !ok {
			return errors.New("CONFIG GET maxmemory-policy returned nothing")
		}
		mu.Lock()
		byNode[addr] = p
		mu.Unlock()
		return nil
	})
	if err != nil {
		return "", "", fmt.Errorf("bucket: read maxmemory-policy: %w", err)
	}
	if p, ok := byNode[""]; ok { // one server, not a Cluster
		return p, evictionWarning(p), nil
	}
	var warnings, parts []string
	distinct := map[string]bool{}
	for addr, p := range byNode {
		distinct[p] = true
		parts = append(parts, addr+"="+p)
		if w := evictionWarning(p); w != "" {
			warnings = append(warnings, addr+": "+w)
		}
	}
	sort.Strings(parts)
	sort.Strings(warnings)
	if len(distinct) == 1 {
		for p := range distinct {
			policy = p
		}
	} else {
		policy = strings.Join(parts, ",")
	}
	return policy, strings.Join(warnings, "; "), nil
}

// eachMaster runs fn on c's one server (addr "") or, for a Cluster, on
// every master (concurrently; addr names it, and an error from fn is
// prefixed with it), and returns the first error.
func eachMaster(ctx context.Context, c redis.UniversalClient, fn func(ctx context.Context, addr string, n redis.Cmdable) error) error {
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		return fn(ctx, "", c)
	}
	return cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		addr := n.Options().Addr
		if err := fn(ctx, addr, n); err != nil {
			return fmt.Errorf("%s: %w", addr, err)
		}
		return nil
	})
}

func evictionWarning(policy string) string {
	switch {
	case policy == "noeviction":
		return ""
	case strings.HasPrefix(policy, "volatile-"):
		return fmt.Sprintf("maxmemory-policy is %s: under memory pressure Redis may evict keys that have a TTL, "+
			"which every bucket with a refill rate and every request-id record has; an evicted bucket "+
			"comes back full (budget returned early) and an evicted request id can be charged twice. "+
			"Buckets with rate 0 have no TTL and are safe. Set maxmemory-policy noeviction", policy)
	default:
		return fmt.Sprintf("maxmemory-policy is %s: under memory pressure Redis may evict buckets, which then "+
			"come back full (budget returned early, silently). Set maxmemory-policy noeviction", policy)
	}
}

// MinRedisVersion is the oldest Redis the bucket script runs on: it keeps
// a key's TTL across writes with SET KEEPTTL (Redis 6.0).
const MinRedisVersion = "6.0"

// CheckVersion reads redis_version on every master c decides on and
// returns a warning naming each one older than MinRedisVersion, whose
// every Redis-path decision would fail (and go to the rule's failure
// policy); "" when all are recent enough.
func CheckVersion(ctx context.Context, c redis.UniversalClient) (warning string, err error) {
	var mu sync.Mutex
	var warnings []string
	err = eachMaster(ctx, c, func(ctx context.Context, addr string, n redis.Cmdable) error {
		info, err := n.Info(ctx, "server").Result()
		if err != nil {
			return err
		}
		v := ""
		for line := range strings.SplitSeq(info, "\n") {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
				v = rest
				break
			}
		}
		if v == "" {
			return errors.New("INFO server has no redis_version")
		}
		if versionBefore(v, MinRedisVersion) {
			if addr != "" {
				addr += ": "
			}
			mu.Lock()
			warnings = append(warnings, fmt.Sprintf("%sredis_version %s is older than %s: the bucket script needs SET KEEPTTL, so every Redis-path decision fails and goes to its rule's failure policy; upgrade Redis", addr, v, MinRedisVersion))
			mu.Unlock()
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("bucket: read redis_version: %w", err)
	}
	sort.Strings(warnings)
	return strings.Join(warnings, "; "), nil
}

// versionBefore reports whether dotted version v is older than min,
// comparing numbers part by part ("6.0" is not before "6.0.0"). A part
// that is not a number (a vendor's suffix) ends the comparison there.
func versionBefore(v, min string) bool {
	vs, ms := strings.Split(v, "."), strings.Split(min, ".")
	for i, m := range ms {
		want, _ := strconv.Atoi(m)
		if i >= len(vs) {
			return want > 0
		}
		got, err := strconv.Atoi(vs[i])
		if err != nil {
			return false
		}
		if got != want {
			return got < want
		}
	}
	return false
}
