package agent

import (
	"math"
	"sync"
	"sync/atomic"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ration-dev/ration/client/header"
)

// rlsShape is what a rule's shape (its name, burst and rate) puts in every
// ShouldRateLimit answer deciding by it, whatever the bucket holds: the
// DescriptorStatus's current_limit, encoded with its tag and length, and
// the rule's RateLimit-Policy list member. Envoy's path builds them once
// per shape, not once per call.
type rlsShape struct {
	limit  []byte
	policy []byte
}

// shapeKey is the inputs a shape is a function of, floats by their bits.
type shapeKey struct {
	rule        string
	limit, rate uint64
}

// maxRLSShapes bounds the cache: a rule set has a shape per rule (and per
// region's tuning); past the bound the cache starts over, so a stream of
// reloads or tunings cannot grow it without end.
const maxRLSShapes = 4096

// rlsShapes caches shapes by key. Entries are never changed, only added,
// and the map is replaced whole when full.
var rlsShapes struct {
	m atomic.Pointer[sync.Map]
	n atomic.Int64
}

func init() { rlsShapes.m.Store(new(sync.Map)) }

// shapeOf returns the shape of a rule of burst limit and refill rate.
func shapeOf(rule string, limit, rate float64) *rlsShape {
	k := shapeKey{rule: rule, limit: math.Float64bits(limit), rate: math.Float64bits(rate)}
	m := rlsShapes.m.Load()
	if v, ok := m.Load(k); ok {
		return v.(*rlsShape)
	}
	sh := newShape(rule, limit, rate)
	if rlsShapes.n.Add(1) > maxRLSShapes {
		m = new(sync.Map)
		rlsShapes.m.Store(m)
		rlsShapes.n.Store(1)
	}
	m.Store(k, sh)
	return sh
}

func newShape(rule string, limit, rate float64) *rlsShape {
	perUnit, window := limitOf(limit, rate)
	var lim []byte
	lim = appendVarintField(lim, rlsPerUnit, uint64(perUnit))
	if window > 0 {
		lim = appendVarintField(lim, rlsUnit, uint64(rlsv3.RateLimitResponse_RateLimit_SECOND))
	}
	lim = appendStringField(lim, rlsName, rule)
	if window > 0 {
		lim = protowire.AppendTag(lim, rlsUnitMultiplier, protowire.BytesType)
		lim = protowire.AppendVarint(lim, uint64(varintFieldSize(1, uint64(window))))
		lim = appendVarintField(lim, 1, uint64(window))
	}
	field := protowire.AppendTag(nil, rlsCurrentLimit, protowire.BytesType)
	field = protowire.AppendBytes(field, lim)
	return &rlsShape{
		limit:  field,
		policy: header.AppendPolicy(nil, header.Quota{Policy: rule, Limit: limit, Rate: rate}),
	}
}
