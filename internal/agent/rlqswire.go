package agent

import (
	"errors"
	"unicode/utf8"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Envoy's RLQS usage reports are read by protobuf's decoder into the
// generated message internal/rlqs checks and applies. protobuf refuses a
// string that is not UTF-8, which gRPC answers INTERNAL ("failed to
// unmarshal"), before rlqs sees the report: no report entry or key named,
// and not counted as a refused report. As for Allow and ShouldRateLimit
// (wireinvalid.go), such a string is the caller's bad input: the codec
// reads a report protobuf refused again with decodeRLQS, which keeps the
// string, and rlqs's check of the report refuses it (INVALID_ARGUMENT
// naming the entry and the key, ration_rlqs_refused_total{reason=
// "invalid"}, the stream ended), as it does every invalid report. Only
// the bytes protobuf refuses pay for a second reading.

// errWireRLQS is a malformed RateLimitQuotaUsageReports.
var errWireRLQS = errors.New("agent: malformed RateLimitQuotaUsageReports")

// unmarshalRLQS reads a usage report as protobuf's codec does, but for a
// string that is not UTF-8, which is left in r for rlqs to refuse.
func (c codec) unmarshalRLQS(data mem.BufferSlice, r *rlqsv3.RateLimitQuotaUsageReports) error {
	err := c.CodecV2.Unmarshal(data, r)
	if err != nil && errors.Is(decodeRLQS(data.Materialize(), r), errWireUTF8) {
		return nil
	}
	return err
}

// decodeRLQS reads a RateLimitQuotaUsageReports into r (reset) as
// proto.Unmarshal does, and fails where it fails, but for a string that
// is not UTF-8 (the domain, a bucket_id entry's key or value): as in
// proto.Unmarshal, the first one ends the reading, and the error is
// errWireUTF8, but the string is kept in r, which holds what was read
// up to it (an entry is read to its end, for its key). Any other
// malformation is errWireRLQS. FuzzDecodeRLQS holds it to proto.Unmarshal.
// Unknown fields are skipped, not kept.
func decodeRLQS(buf []byte, r *rlqsv3.RateLimitQuotaUsageReports) error {
	proto.Reset(r)
	return eachField(buf, func(num protowire.Number, v []byte) error {
		switch num {
		case 1: // domain
			r.Domain = string(v)
			if !utf8.Valid(v) {
				return errWireUTF8
			}
		case 2: // bucket_quota_usages
			u := &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{}
			r.BucketQuotaUsages = append(r.BucketQuotaUsages, u)
			return decodeUsage(v, u)
		}
		return nil
	}, nil)
}

// decodeUsage reads a BucketQuotaUsage into u, merging a message field
// given twice as proto.Unmarshal does.
func decodeUsage(buf []byte, u *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage) error {
	return eachField(buf, func(num protowire.Number, v []byte) error {
		switch num {
		case 1: // bucket_id
			if u.BucketId == nil {
				u.BucketId = &rlqsv3.BucketId{}
			}
			return decodeBucketID(v, u.BucketId)
		case 2: // time_elapsed
			if u.TimeElapsed == nil {
				u.TimeElapsed = &durationpb.Duration{}
			}
			return decodeDuration(v, u.TimeElapsed)
		}
		return nil
	}, func(num protowire.Number, x uint64) {
		switch num {
		case 3:
			u.NumRequestsAllowed = x
		case 4:
			u.NumRequestsDenied = x
		}
	})
}

// decodeBucketID adds a BucketId's entries to id's (readEntry, keeping a
// string that is not UTF-8).
func decodeBucketID(buf []byte, id *rlqsv3.BucketId) error {
	return eachField(buf, func(num protowire.Number, e []byte) error {
		if num != 1 { // bucket
			return nil
		}
		k, v, err := readEntry(string(e), true)
		if err != nil && !errors.Is(err, errWireUTF8) {
			return errWireRLQS
		}
		if id.Bucket == nil {
			id.Bucket = map[string]string{}
		}
		id.Bucket[k] = v
		return err
	}, nil)
}

// decodeDuration merges a google.protobuf.Duration into d.
func decodeDuration(buf []byte, d *durationpb.Duration) error {
	return eachField(buf, nil, func(num protowire.Number, x uint64) {
		switch num {
		case 1:
			d.Seconds = int64(x)
		case 2:
			d.Nanos = int32(x)
		}
	})
}

// eachField reads the fields of a message: a length-delimited one goes to
// bytes, a varint to varint (each may be nil, and ignores the numbers it
// does not know), any other is skipped. The first error bytes returns
// ends the reading; a malformed field is errWireRLQS.
func eachField(buf []byte, bytes func(protowire.Number, []byte) error, varint func(protowire.Number, uint64)) error {
	for len(buf) > 0 {
		num, typ, n := protowire.ConsumeTag(buf)
		if n < 0 || num > protowire.MaxValidNumber {
			return errWireRLQS
		}
		buf = buf[n:]
		switch {
		case typ == protowire.BytesType && bytes != nil:
			v, n := protowire.ConsumeBytes(buf)
			if n < 0 {
				return errWireRLQS
			}
			if err := bytes(num, v); err != nil {
				return err
			}
			buf = buf[n:]
		case typ == protowire.VarintType && varint != nil:
			x, n := protowire.ConsumeVarint(buf)
			if n < 0 {
				return errWireRLQS
			}
			varint(num, x)
			buf = buf[n:]
		default:
			n, err := skipField(num, typ, buf)
			if err != nil {
				return errWireRLQS
			}
			buf = buf[n:]
		}
	}
	return nil
}
