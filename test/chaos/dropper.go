package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// ReplyDropper is a gRPC Leases service in front of one coordinator that
// forwards every Renew and Release and then, with probability p, drops
// the reply (answers UNAVAILABLE): the call was applied but the agent
// cannot know, and retries it with the same (holder, seq). It checks what
// the retry gets: the answer the coordinator recorded, i.e. the request
// was applied once. (A TCP proxy drops bytes, not messages; this drops
// whole replies.)
type ReplyDropper struct {
	rationv1.UnimplementedLeasesServer
	up   *passThrough
	addr string

	mu      sync.Mutex
	rng     *rand.Rand
	p       float64
	dropped map[string]*rationv1.RenewResponse // holder/seq -> the reply the agent never got
	Stats   DropStats
}

// DropStats counts what the dropper saw.
type DropStats struct {
	Calls, Dropped, Retried int
	// Streams counts the RenewStreams agents opened through the dropper.
	Streams int
	// Mismatched lists retries whose answer differed from the dropped
	// one (a request applied twice).
	Mismatched []string
}

// NewReplyDropper serves on a free loopback port, forwarding to upstream.
func NewReplyDropper(t testing.TB, upstream string, p float64, rng *rand.Rand) *ReplyDropper {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &ReplyDropper{up: newPassThrough(t, upstream), addr: ln.Addr().String(), rng: rng, p: p,
		dropped: map[string]*rationv1.RenewResponse{}}
	srv := grpc.NewServer(proxyServerCreds(t))
	rationv1.RegisterLeasesServer(srv, d)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return d
}

// Addr is where agents connect.
func (d *ReplyDropper) Addr() string { return d.addr }

// SetDropRate changes the probability p of dropping a reply (0: none).
func (d *ReplyDropper) SetDropRate(p float64) {
	d.mu.Lock()
	d.p = p
	d.mu.Unlock()
}

// Snapshot returns the counts so far.
func (d *ReplyDropper) Snapshot() DropStats {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.Stats
	s.Mismatched = append([]string(nil), s.Mismatched...)
	return s
}

func (d *ReplyDropper) drop() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.Stats.Calls++
	if d.rng.Float64() < d.p {
		d.Stats.Dropped++
		return true
	}
	return false
}

var errDropped = status.Error(codes.Unavailable, "chaos: reply dropped after the coordinator applied the request")

// Renew forwards, then maybe drops the reply; a retry of a dropped
// request is compared with what was dropped.
func (d *ReplyDropper) Renew(ctx context.Context, req *rationv1.RenewRequest) (*rationv1.RenewResponse, error) {
	up, err := d.up.leases(ctx)
	if err != nil {
		return nil, err
	}
	resp, err := up.Renew(ctx, req)
	if err != nil {
		return nil, err
	}
	if d.answered(req, resp) {
		return resp, nil
	}
	return nil, errDropped
}

// answered checks resp against the reply dropped earlier for the same
// (holder, seq), if any, and says whether the agent gets it: false when
// this reply is dropped too (recorded for the retry's check).
func (d *ReplyDropper) answered(req *rationv1.RenewRequest, resp *rationv1.RenewResponse) bool {
	key := fmt.Sprintf("%s/%d", req.Holder, req.Seq)
	d.mu.Lock()
	if prev, ok := d.dropped[key]; ok {
		d.Stats.Retried++
		delete(d.dropped, key)
		if !sameAnswer(prev, resp) {
			d.Stats.Mismatched = append(d.Stats.Mismatched, fmt.Sprintf("%s: dropped %v, retry got %v", key, prev, resp))
		}
	}
	d.mu.Unlock()
	if d.drop() {
		d.mu.Lock()
		d.dropped[key] = resp
		d.mu.Unlock()
		return false
	}
	return true
}

// RenewStream forwards a stream of Renew calls on a stream of its own to
// the coordinator (so the node's stream serving is what answers) and
// drops replies as Renew does: a dropped call is answered UNAVAILABLE in
// its reply, which the agent retries with the same (holder, seq), on the
// same stream or a new one.
func (d *ReplyDropper) RenewStream(down rationv1.Leases_RenewStreamServer) error {
	ctx := down.Context()
	d.mu.Lock()
	d.Stats.Streams++
	d.mu.Unlock()
	up, err := d.up.leases(ctx)
	if err != nil {
		return err
	}
	ust, err := up.RenewStream(ctx)
	if err != nil {
		return err
	}
	var mu sync.Mutex
	reqs := map[uint64]*rationv1.RenewRequest{} // the calls in flight, by id
	go func() {
		for {
			call, err := down.Recv()
			if err != nil {
				_ = ust.CloseSend() // the node answers what it has, then ends
				return
			}
			mu.Lock()
			reqs[call.GetId()] = call.GetRequest()
			mu.Unlock()
			if ust.Send(call) != nil {
				return // Recv below reports the stream's end
			}
		}
	}()
	for {
		r, err := ust.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		mu.Lock()
		req := reqs[r.GetId()]
		delete(reqs, r.GetId())
		mu.Unlock()
		if r.GetCode() == 0 && req != nil && !d.answered(req, r.GetResponse()) {
			st := status.Convert(errDropped)
			r = &rationv1.RenewReply{Id: r.GetId(), Code: int32(st.Code()), Message: st.Message()}
		}
		if err := down.Send(r); err != nil {
			return err
		}
	}
}

// sameAnswer: the last item is answered again from the record; a grant
// before it may instead be refused as "grant answer lost on retry" (the
// lease exists, its first balance is forfeit), never granted again.
func sameAnswer(prev, retry *rationv1.RenewResponse) bool {
	if len(prev.Grants) != len(retry.Grants) {
		return false
	}
	for i, g := range retry.Grants {
		if proto.Equal(g, prev.Grants[i]) {
			continue
		}
		if i < len(retry.Grants)-1 && g.Error == "grant answer lost on retry" {
			continue
		}
		return false
	}
	return true
}

// Release forwards, then maybe drops the reply.
func (d *ReplyDropper) Release(ctx context.Context, req *rationv1.ReleaseRequest) (*rationv1.ReleaseResponse, error) {
	up, err := d.up.leases(ctx)
	if err != nil {
		return nil, err
	}
	resp, err := up.Release(ctx, req)
	if err != nil {
		return nil, err
	}
	if d.drop() {
		return nil, errDropped
	}
	return resp, nil
}
