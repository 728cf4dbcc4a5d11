package sim

import (
	"fmt"
	"strings"
)

// fault is one injected failure or demand change, from..to.
type fault struct {
	name        string
	from, to    int64
	start, stop func()
	// shift: a demand change whose follow time is measured, on these keys.
	shift []int
	// darkRegion >= 0: a region whose demand stops; its upstream share of
	// the global rule is followed down and back up.
	darkRegion int
}

// schedule is the fault schedule of a run with Faults: the same for every
// seed (the seed draws latencies, losses, clocks, elections and demand),
// placed at fractions of the run so that Small and Reference meet the same
// faults.
func schedule(s *Sim) []fault {
	D := s.end
	R := s.cfg.Regions
	at := func(f float64) int64 { return int64(f * float64(D)) }
	span := func(f float64) int64 { return int64(f * float64(D)) }
	inRegionGroup := func(r int) func(endpoint) bool {
		return func(e endpoint) bool { return e.node != nil && e.node.g.region == r }
	}
	inGlobal := func(e endpoint) bool { return e.node != nil && e.node.g.region < 0 }
	var fs []fault
	cut := func(name string, from, to int64, a, b func(endpoint) bool) {
		p := partition{name: name, from: from, to: to, a: a, b: b}
		fs = append(fs, fault{name: name, from: from, to: to,
			start: func() { s.partitions = append(s.partitions, p); s.logf("fault: %s", name) },
			stop:  func() { s.logf("healed: %s", name) },
		})
	}

	// 1. A region's group cut from the global group: its upstream lease
	// lapses, the global rule's funding there drops to the safe share (0).
	r1 := 1 % R
	cut(fmt.Sprintf("region %s's group cut from the global group", s.regionName(r1)), at(0.10), at(0.10)+span(0.05), inRegionGroup(r1), inGlobal)

	// 2. The global group's leader crashes.
	fs = append(fs, crash(s, s.global, at(0.20), at(0.20)+span(0.04)))

	// 3. A regional leader cut from its followers: a new leader on the
	// majority side, the old one commits nothing.
	r2 := 2 % R
	g2 := s.groups[1+r2]
	var isolated *cnode
	fs = append(fs, fault{name: "regional leader isolated", from: at(0.30), to: at(0.30) + span(0.03),
		start: func() {
			isolated = g2.leaderNode()
			if isolated == nil {
				isolated = g2.nodes[0]
			}
			n := isolated
			s.partitions = append(s.partitions, partition{name: "isolate", from: s.now, to: at(0.30) + span(0.03),
				a: func(e endpoint) bool { return e.node == n },
				b: func(e endpoint) bool { return e.node != nil && e.node.g == g2 && e.node != n },
			})
			s.logf("fault: %s: leader node %d cut from its followers", g2.name, n.idx)
		},
		stop: func() { s.logf("healed: %s leader isolation", g2.name) },
	})

	// 4. A region goes dark: its demand stops, the global rule's share
	// moves to the other regions (measured: time to follow).
	r3 := 3 % R
	fs = append(fs, fault{name: fmt.Sprintf("region %s dark", s.regionName(r3)), from: at(0.40), to: at(0.40) + span(0.10),
		start: func() {
			s.dark[r3] = true
			s.darkRef[r3] = s.upRates[r3][max(0, int(s.now/1e6)-1)]
			s.logf("demand: region %s goes dark", s.regionName(r3))
		},
		stop:       func() { s.dark[r3] = false; s.logf("demand: region %s back", s.regionName(r3)) },
		darkRegion: r3,
	})

	// 5. A flash crowd on the least popular hot subject of region 0.
	hk := s.cfg.HotSubjects - 1
	hotKey := s.specs[fmt.Sprintf("%s|%s-s%d", ruleHot, s.regionName(0), hk)].key
	fs = append(fs, fault{name: "flash crowd", from: at(0.55), to: at(0.55) + span(0.10),
		start: func() { s.flash[0] = hk; s.logf("demand: flash crowd on %s-s%d", s.regionName(0), hk) },
		stop:  func() { s.flash[0] = -1; s.logf("demand: flash crowd over") },
		shift: []int{hotKey},
	})

	// 6. A tenth of a region's agents crash, and come back as new
	// incarnations.
	r4 := 4 % R
	var crashed []*agent
	fs = append(fs, fault{name: "agents crash", from: at(0.65), to: at(0.65) + span(0.02),
		start: func() {
			crashed = nil
			for i, a := range s.byRegion[r4] {
				if i%10 == 0 {
					a.crash()
					crashed = append(crashed, a)
					s.stats.crashes++
				}
			}
			s.logf("fault: %d agents of region %s crash", len(crashed), s.regionName(r4))
		},
		stop: func() {
			for _, a := range crashed {
				if err := a.start(); err != nil {
					s.fail("agent %d restart: %v", a.idx, err)
				}
			}
			s.logf("healed: %d agents of region %s restarted", len(crashed), s.regionName(r4))
		},
	})

	// 7. Half of a region's agents cut from their coordinators, longer than
	// a lease in the reference run: their leases lapse, the rule's policy
	// (fail closed) applies, the others get the region's share.
	r5 := 5 % R
	cut(fmt.Sprintf("half of region %s's agents cut from their group", s.regionName(r5)), at(0.75), at(0.75)+span(0.08),
		func(e endpoint) bool { return e.agent != nil && e.agent.region == r5 && e.agent.idx%2 == 0 }, inRegionGroup(r5))

	// 8. A regional group's leader crashes.
	fs = append(fs, crash(s, s.groups[1+6%R], at(0.85), at(0.85)+span(0.03)))
	for i := range fs {
		if !strings.HasSuffix(fs[i].name, " dark") {
			fs[i].darkRegion = -1
		}
	}
	return fs
}

// crash takes g's leader node down from..to, at the worst moment of
// Raft's: once the next entry it proposes has reached a follower and
// before any follower's ack is back, so that the next leader finds an
// entry of the lost term in its log (see elect).
func crash(s *Sim, g *group, from, to int64) fault {
	var n *cnode
	down := func() {
		n = g.leaderNode()
		if n == nil {
			n = g.nodes[0]
		}
		n.alive = false
		s.logf("fault: %s: node %d (leader) crashes", g.name, n.idx)
		g.loseLeader("crashed")
	}
	return fault{name: g.name + " leader crash", from: from, to: to,
		start: func() {
			if g.leaderNode() == nil {
				down()
				return
			}
			g.midEntry = down
		},
		stop: func() {
			g.midEntry = nil
			if n == nil {
				return // no entry proposed all along: no crash
			}
			n.alive = true
			s.logf("healed: %s: node %d back as a follower", g.name, n.idx)
		},
	}
}
