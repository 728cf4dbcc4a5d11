package coordclient_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/internal/coordclient"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// closedAddr returns a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// TestClientGivesUp: with no coordinator reachable, a call ends after
// MaxAttempts with the last UNAVAILABLE, or at the caller's deadline;
// a closed client and an empty address list fail at once.
func TestClientGivesUp(t *testing.T) {
	req := &rationv1.RenewRequest{Holder: "a", Seq: 1, Items: []*rationv1.RenewItem{{Quota: &rationv1.QuotaRef{Rule: "r", Subject: "s"}}}}
	cl := coordclient.New([]string{closedAddr(t), closedAddr(t)}, coordclient.Options{
		MaxAttempts: 3, BackoffMin: time.Millisecond, BackoffMax: 2 * time.Millisecond,
	})
	defer cl.Close()
	_, err := cl.Renew(context.Background(), req)
	if status.Code(err) != codes.Unavailable {
		t.Errorf("Renew with nothing listening = %v, want UNAVAILABLE after 3 attempts", err)
	}

	patient := coordclient.New([]string{closedAddr(t)}, coordclient.Options{MaxAttempts: 1 << 30})
	defer patient.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := patient.Renew(ctx, req); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Renew past the caller's deadline = %v, want context.DeadlineExceeded", err)
	}

	cl.Close()
	if _, err := cl.Renew(context.Background(), req); !errors.Is(err, coordclient.ErrStopped) {
		t.Errorf("Renew after Close = %v, want ErrStopped", err)
	}
	empty := coordclient.New(nil, coordclient.Options{})
	if _, err := empty.Release(context.Background(), &rationv1.ReleaseRequest{}); !errors.Is(err, coordclient.ErrInvalidRequest) {
		t.Errorf("Release with no addresses = %v, want ErrInvalidRequest", err)
	}
}
