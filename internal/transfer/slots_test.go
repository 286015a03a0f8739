package transfer

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// TestSlots: a peer takes at most its share of the slots, all peers at
// most all of them; a released slot is free again.
func TestSlots(t *testing.T) {
	s := newSlots(3, 2)
	r1, err := s.take("a")
	if err != nil {
		t.Fatal(err)
	}
	r2, err := s.take("a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.take("a"); !errdefs.IsUnavailable(err) {
		t.Fatalf("a third slot for one peer: got %v, want Unavailable", err)
	}
	r3, err := s.take("b")
	if err != nil {
		t.Fatalf("another peer: %v", err)
	}
	if _, err := s.take("c"); !errdefs.IsUnavailable(err) {
		t.Fatalf("a slot past all of them: got %v, want Unavailable", err)
	}
	r1()
	r4, err := s.take("c")
	if err != nil {
		t.Fatalf("a released slot: %v", err)
	}
	for _, r := range []func(){r2, r3, r4} {
		r()
	}
	if len(s.all) != 0 || len(s.peers) != 0 {
		t.Errorf("after all released: %d slots taken, peers %v", len(s.all), s.peers)
	}
}

var trickling = 6

// TestTricklingPeerHoldsNoSlot: a node that is trusted but granted
// nothing opens more pulls and image requests than there are slots and
// trickles their bodies: it holds no slot meanwhile (a granted peer
// pulls), and each of its requests is answered once its body took
// longer than allowed.
func TestTricklingPeerHoldsNoSlot(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	trust := StaticTrust{}
	a, b, evil := newNode(t, "a", trust), newNode(t, "b", trust), newNode(t, "evil", trust)
	a.write(t, "sb-1", "", "f", mb)
	a.checkpoint(t, "ck-1", "sb-1", false)
	a.grant(b, "ck-1")
	srv, err := NewServer(ServerOptions{Identity: a.id, Trust: trust, Grants: a.grants, Local: a.local, MaxConcurrent: 1,
		BodyTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	addr, err := srv.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	pinned, _ := CertDER(a.id.CertPEM)
	var conns []*tls.Conn
	for i := range trickling {
		c, err := tls.Dial("tcp", addr.String(), clientTLS(evil.id, pinned))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		path := "/v1/pull"
		if i%2 == 1 {
			path = "/v1/image"
		}
		// The headers and the first byte of a body that never comes.
		if _, err := fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: a\r\nContent-Length: 1000\r\n\r\n{", path); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	peer := Peer{Node: "a", Endpoint: addr.String(), CertPEM: a.id.CertPEM}
	if _, err := b.client.Pull(ctx, peer, Request{Checkpoint: "ck-1", UUID: a.uuid(t, "ck-1")}); err != nil {
		t.Fatalf("a granted pull beside a trickling peer: %v", err)
	}
	for i, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(time.Minute))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("trickling request %d: no answer: %v", i, err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Errorf("trickling request %d: got %s, want a refusal", i, resp.Status)
		}
	}
}
