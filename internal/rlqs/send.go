package rlqs

import (
	"fmt"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// unreadError ends a stream whose Envoy took no response for after.
type unreadError struct{ after time.Duration }

func (e unreadError) Error() string {
	return fmt.Sprintf("rlqs: the stream's responses went unread for %v; the stream is ended (its buckets' assignments lapse: open it again)", e.after)
}

func (e unreadError) GRPCStatus() *status.Status {
	return status.New(codes.DeadlineExceeded, e.Error())
}

// sender sends a stream's responses from a goroutine of its own, so that
// the handler can give up on a Send that blocks: gRPC's Send waits for
// the client's flow-control window, for good if the client never reads,
// and only the end of the handler unblocks it.
type sender struct {
	g       rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasServer
	timeout time.Duration
	stop    <-chan struct{}
	in      chan *rlqsv3.RateLimitQuotaResponse
	res     chan error // one result per response; room for the last one
}

func newSender(g rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasServer, timeout time.Duration, stop <-chan struct{}) *sender {
	sd := &sender{g: g, timeout: timeout, stop: stop, in: make(chan *rlqsv3.RateLimitQuotaResponse), res: make(chan error, 1)}
	go sd.run()
	return sd
}

func (sd *sender) run() {
	for r := range sd.in {
		sd.res <- sd.g.Send(r)
	}
}

// send sends r, or gives up after the timeout (or when the server stops):
// the handler then returns, which ends the stream and the Send with it.
// Only the handler's goroutine calls it, one response at a time.
func (sd *sender) send(r *rlqsv3.RateLimitQuotaResponse) error {
	sd.in <- r // run waits for it: the previous response's result was read
	t := time.NewTimer(sd.timeout)
	defer t.Stop()
	select {
	case err := <-sd.res:
		return err
	case <-t.C:
		return unreadError{sd.timeout}
	case <-sd.stop:
		return errStopping
	}
}

// close ends run once its Send, if any, returns (at the handler's end).
func (sd *sender) close() { close(sd.in) }
