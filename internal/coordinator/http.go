package coordinator

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ration-dev/ration/internal/httpsafe"
)

// serveHTTP serves /metrics, /healthz, /readyz and the status page (/ and
// /status.json, status.go).
//
// /healthz: the process is up and its state machine has not stopped.
// /readyz: a leader is known and, when that is this node, it has applied
// its LeaderElected entry. A follower is ready while it knows the leader:
// it answers with a redirect to it, which is what clients need.
func (n *Node) serveHTTP() error {
	lis, err := net.Listen("tcp", n.cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("coordinator: -http %s: %w", n.cfg.HTTPAddr, err)
	}
	n.httpLis = lis
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(n.reg, promhttp.HandlerOpts{Registry: n.reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := n.health(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := n.readiness(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	n.serveStatus(mux)
	n.httpServer = &http.Server{Handler: httpsafe.Recover(mux, n.logger), ErrorLog: httpsafe.ErrorLog(n.logger, time.Minute), ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout: 10 * time.Second, WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute,
		MaxHeaderBytes: 64 << 10}
	n.wg.Add(2)
	go n.sampleStatus()
	go func() {
		defer n.wg.Done()
		if err := n.httpServer.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			n.logger.Error("HTTP server stopped", "err", err)
		}
	}()
	return nil
}

func (n *Node) health() error {
	if err := n.fsm.Stopped(); err != nil {
		return err
	}
	if n.raft.State() == raft.Shutdown {
		return ErrStopped
	}
	return nil
}

func (n *Node) readiness() error {
	if err := n.health(); err != nil {
		return err
	}
	id, _ := n.Leader()
	switch {
	case id == "":
		return errors.New("no leader known")
	case id == n.cfg.ID && !n.Ready():
		return ErrNotReady
	}
	return nil
}
