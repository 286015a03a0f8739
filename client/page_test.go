package client

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"strconv"
	"testing"

	"connectrpc.com/connect"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/api/forkbox/v1/forkboxv1connect"
	"github.com/forkbox/forkbox/errdefs"
)

// pagedService serves n sandboxes in pages, with offsets as tokens, and
// records the page sizes it was asked for.
type pagedService struct {
	forkboxv1connect.UnimplementedSandboxServiceHandler
	n     int
	sizes []int32
}

func (p *pagedService) ListSandboxes(_ context.Context, req *connect.Request[v1.ListSandboxesRequest]) (*connect.Response[v1.ListSandboxesResponse], error) {
	p.sizes = append(p.sizes, req.Msg.PageSize)
	from := 0
	if t := req.Msg.PageToken; t != "" {
		var err error
		if from, err = strconv.Atoi(t); err != nil {
			return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("bad page token"))
		}
	}
	size := int(req.Msg.PageSize)
	if size == 0 {
		size = 100
	}
	out := &v1.ListSandboxesResponse{}
	for i := from; i < min(from+size, p.n); i++ {
		out.Sandboxes = append(out.Sandboxes, &v1.Sandbox{Id: fmt.Sprintf("sb-%d", i)})
	}
	if from+size < p.n {
		out.NextPageToken = strconv.Itoa(from + size)
	}
	return connect.NewResponse(out), nil
}

func pagedClient(t *testing.T, n int) (*Client, *pagedService) {
	svc := &pagedService{n: n}
	_, h := forkboxv1connect.NewSandboxServiceHandler(svc)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &Client{URL: srv.URL}, svc
}

func TestAllSandboxesFollowsPages(t *testing.T) {
	ctx := context.Background()
	c, svc := pagedClient(t, 250)
	seen := map[string]int{}
	for sb, err := range c.AllSandboxes(ctx, ListOptions{PageSize: 40}) {
		if err != nil {
			t.Fatal(err)
		}
		seen[sb.Id]++
	}
	if len(seen) != 250 {
		t.Fatalf("got %d sandboxes, want 250", len(seen))
	}
	for id, n := range seen {
		if n != 1 {
			t.Fatalf("%s: got %d times, want once", id, n)
		}
	}
	if len(svc.sizes) != 7 || svc.sizes[0] != 40 {
		t.Fatalf("got page requests %v, want 7 of 40", svc.sizes)
	}

	// Stopping early fetches no further page.
	svc.sizes = nil
	n := 0
	for _, err := range c.AllSandboxes(ctx, ListOptions{PageSize: 10}) {
		if err != nil {
			t.Fatal(err)
		}
		if n++; n == 15 {
			break
		}
	}
	if len(svc.sizes) != 2 {
		t.Fatalf("stopping after 15 of pages of 10: got %d page requests, want 2", len(svc.sizes))
	}

	all, err := c.ListSandboxes(ctx, false)
	if err != nil || len(all) != 250 {
		t.Fatalf("ListSandboxes: got %d, %v, want 250", len(all), err)
	}
}

func TestAllSandboxesBadToken(t *testing.T) {
	c, _ := pagedClient(t, 5)
	var got error
	for sb, err := range c.AllSandboxes(context.Background(), ListOptions{PageToken: "nope"}) {
		if sb != nil {
			t.Fatalf("got a sandbox %s with a bad token", sb.Id)
		}
		got = err
	}
	if !errdefs.IsInvalidArgument(got) {
		t.Fatalf("bad token: got %v, want InvalidArgument", got)
	}
}
