package transfer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// Slots. A server serves a bounded number of requests at once, and one
// peer takes at most part of them: a node that is trusted but granted
// nothing, or slow on purpose, cannot hold every slot. A request takes
// its slot only once its peer is known and its body read, which has its
// own bound in time (ServerOptions.BodyTimeout): a peer that trickles
// its body holds a connection that long, and no slot.

// slots bounds concurrent requests in all and per peer.
type slots struct {
	all     chan struct{}
	perPeer int

	mu    sync.Mutex
	peers map[string]int
}

func newSlots(n, perPeer int) *slots {
	return &slots{all: make(chan struct{}, n), perPeer: max(1, perPeer), peers: map[string]int{}}
}

// take takes a slot for peer, or returns an Unavailable error (retried
// by receivers) when none is free for it.
func (s *slots) take(peer string) (release func(), err error) {
	s.mu.Lock()
	if s.peers[peer] >= s.perPeer {
		s.mu.Unlock()
		return nil, fmt.Errorf("node %s has %d requests in flight, limit %d: %w", peer, s.perPeer, s.perPeer, errdefs.ErrUnavailable)
	}
	s.peers[peer]++
	s.mu.Unlock()
	select {
	case s.all <- struct{}{}:
	default:
		s.put(peer)
		return nil, fmt.Errorf("too many requests in flight: %w", errdefs.ErrUnavailable)
	}
	return func() {
		<-s.all
		s.put(peer)
	}, nil
}

func (s *slots) put(peer string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.peers[peer]--; s.peers[peer] <= 0 {
		delete(s.peers, peer)
	}
}

// bounded gives a request with a body timeout to send it (its
// connection's read deadline), and closes the connection after the
// answer unless readBody read the body whole: the server would otherwise
// wait, without a bound, for the rest of a body the handler refused
// unread. A request without a body has no deadline: its answer (a blob)
// may stream for as long as it takes.
func bounded(timeout time.Duration, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength != 0 {
			_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(timeout))
			w.Header().Set("Connection", "close")
		}
		h.ServeHTTP(w, r)
	})
}

// readBody decodes r's JSON body into v, reading at most maxRequest bytes
// within the deadline bounded set; once it is read whole the deadline is
// lifted, so the response may stream for as long as it takes.
func readBody(w http.ResponseWriter, r *http.Request, timeout time.Duration, v any) error {
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(timeout))
	b, err := io.ReadAll(io.LimitReader(r.Body, maxRequest+1))
	if err == nil && len(b) <= maxRequest {
		_ = rc.SetReadDeadline(time.Time{})
		w.Header().Del("Connection")
	}
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("the request body took longer than %v: %w", timeout, errdefs.ErrDeadlineExceeded)
	case err != nil:
		return fmt.Errorf("read the request: %v: %w", err, errdefs.ErrInvalidArgument)
	case len(b) > maxRequest:
		return fmt.Errorf("a request of more than %d bytes: %w", maxRequest, errdefs.ErrInvalidArgument)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("bad request: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	return nil
}
