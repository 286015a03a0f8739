package client

import (
	"context"
	"iter"
	"math"

	"connectrpc.com/connect"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/errdefs/errconnect"
)

// ListOptions selects a page of sandboxes: closed ones too when All; at
// most PageSize (0 = the daemon's default, 100; at most 1,000), after the
// page whose NextPageToken is PageToken ("" = the first page).
type ListOptions struct {
	All       bool
	PageSize  int
	PageToken string
}

// SandboxPage is one page of the sandbox list, oldest first;
// NextPageToken is "" on the last page.
type SandboxPage struct {
	Sandboxes     []*Info
	NextPageToken string
}

// ListSandboxesPage returns one page of sandboxes. A page token from
// another request (or made up) is InvalidArgument.
func (c *Client) ListSandboxesPage(ctx context.Context, o ListOptions) (*SandboxPage, error) {
	c.init()
	resp, err := c.sbx.ListSandboxes(ctx, connect.NewRequest(&v1.ListSandboxesRequest{
		All: o.All, PageSize: pageSize(o.PageSize), PageToken: o.PageToken}))
	if err != nil {
		return nil, errconnect.FromConnect(err)
	}
	return &SandboxPage{Sandboxes: resp.Msg.Sandboxes, NextPageToken: resp.Msg.NextPageToken}, nil
}

// AllSandboxes iterates over every sandbox, fetching pages of o.PageSize
// as it goes (from o.PageToken). It stops at the first error, which it
// yields with a nil *Info.
//
//	for sb, err := range c.AllSandboxes(ctx, client.ListOptions{}) { ... }
func (c *Client) AllSandboxes(ctx context.Context, o ListOptions) iter.Seq2[*Info, error] {
	return func(yield func(*Info, error) bool) {
		for {
			page, err := c.ListSandboxesPage(ctx, o)
			if err != nil {
				yield(nil, err)
				return
			}
			for _, sb := range page.Sandboxes {
				if !yield(sb, nil) {
					return
				}
			}
			if page.NextPageToken == "" {
				return
			}
			o.PageToken = page.NextPageToken
		}
	}
}

// ListAll collects AllSandboxes.
func (c *Client) ListAll(ctx context.Context, o ListOptions) ([]*Info, error) {
	var out []*Info
	for sb, err := range c.AllSandboxes(ctx, o) {
		if err != nil {
			return nil, err
		}
		out = append(out, sb)
	}
	return out, nil
}

// pageSize is a page size as the API carries it (the daemon bounds it).
func pageSize(n int) int32 { return int32(min(n, math.MaxInt32)) }

// fullPage is the page size the list-everything helpers ask for.
const fullPage = 1000
