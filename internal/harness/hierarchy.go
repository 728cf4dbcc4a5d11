package harness

import (
	"strings"
	"testing"

	"github.com/ration-dev/ration/internal/coordinator"
)

// Hierarchy is a global coordinator group and regional groups whose
// leaders lease scope: global, mode: leased rules from it (-region,
// -upstream), as StartHierarchy and AddRegion start them. Each region
// reaches every global node through a Proxy of its own (Links), shared by
// the region's nodes, so that a test can cut one region off the global
// group while the others stay connected.
type Hierarchy struct {
	t   testing.TB
	pki *PKI
	// rules is the file every group starts with.
	rules string

	Global  *Coordinators
	Regions map[string]*Coordinators
	// Links holds each region's proxies to the global group, one per
	// global node, in the order of Global.GRPCAddrs.
	Links map[string][]*Proxy
}

// StartHierarchy starts the global group of globalN nodes on rulesYAML,
// with mutual TLS on every link when pki is not nil (the regional nodes
// then hold their upstream leases as their region, as in production), in
// plaintext otherwise. AddRegion adds the regions.
func StartHierarchy(t testing.TB, globalN int, rulesYAML string, pki *PKI) *Hierarchy {
	t.Helper()
	h := &Hierarchy{t: t, pki: pki, rules: rulesYAML, Regions: map[string]*Coordinators{}, Links: map[string][]*Proxy{}}
	if pki != nil {
		h.Global = StartCoordinatorsTLS(t, globalN, rulesYAML, pki)
	} else {
		h.Global = StartCoordinators(t, globalN, rulesYAML)
	}
	return h
}

// AddRegion starts region's group of n nodes, each with -region region and
// -upstream the region's proxies to the global group; opts adjust every
// node's configuration after those.
func (h *Hierarchy) AddRegion(region string, n int, opts ...func(*coordinator.Config)) *Coordinators {
	h.t.Helper()
	if h.Regions[region] != nil {
		h.t.Fatalf("harness: region %q started twice", region)
	}
	var ups []string
	for _, a := range h.Global.GRPCAddrs() {
		p := NewProxy(h.t, a)
		h.Links[region] = append(h.Links[region], p)
		ups = append(ups, p.Addr())
	}
	all := append([]func(*coordinator.Config){func(c *coordinator.Config) {
		c.Region = region
		c.Upstream = strings.Join(ups, ",")
	}}, opts...)
	var c *Coordinators
	if h.pki != nil {
		c = StartCoordinatorsTLS(h.t, n, h.rules, h.pki, all...)
	} else {
		c = StartCoordinators(h.t, n, h.rules, all...)
	}
	h.Regions[region] = c
	return c
}

// Cut partitions region from the global group: every byte on its links
// dropped, their connections reset, new ones accepted and then silent
// (what a partition looks like from both ends), until Heal.
func (h *Hierarchy) Cut(region string) {
	for _, p := range h.links(region) {
		p.Blackhole()
		p.Reset()
	}
}

// Heal ends Cut (or any other fault on region's links): the connections
// that lost bytes are closed, and the region's leader reconnects.
func (h *Hierarchy) Heal(region string) {
	for _, p := range h.links(region) {
		p.Heal()
	}
}

func (h *Hierarchy) links(region string) []*Proxy {
	h.t.Helper()
	ps, ok := h.Links[region]
	if !ok {
		h.t.Fatalf("harness: no region %q in the hierarchy", region)
	}
	return ps
}
