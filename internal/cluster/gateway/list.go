package gateway

import (
	"context"
	"encoding/base64"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"connectrpc.com/connect"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
)

// ListSandboxes lists the namespace's Sandboxes as their objects say
// (with all, the closed ones its retention keeps too), oldest first (creation, then name), paged by an opaque token that
// names the last one given.
func (s *sandboxes) ListSandboxes(ctx context.Context, req *connect.Request[v1.ListSandboxesRequest]) (*connect.Response[v1.ListSandboxesResponse], error) {
	size := int(req.Msg.PageSize)
	switch {
	case size < 0:
		return nil, fmt.Errorf("page_size %d: %w", size, errdefs.ErrInvalidArgument)
	case size == 0:
		size = 100
	case size > 1000:
		size = 1000
	}
	after, err := parsePageToken(req.Msg.PageToken)
	if err != nil {
		return nil, err
	}
	var l fbv1.SandboxList
	if err := s.g.c.List(ctx, &l, client.InNamespace(s.g.o.Namespace)); err != nil {
		return nil, kerr(err, "list sandboxes")
	}
	items := l.Items
	slices.SortFunc(items, func(a, b fbv1.Sandbox) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	out := &v1.ListSandboxesResponse{}
	for i := range items {
		sb := &items[i]
		if after != nil && !after.before(sb) {
			continue
		}
		if !req.Msg.All && (!sb.DeletionTimestamp.IsZero() || sb.Closed()) {
			continue
		}
		if len(out.Sandboxes) == size {
			last := out.Sandboxes[len(out.Sandboxes)-1]
			out.NextPageToken = pageToken(last.CreatedAtUnixMs, last.Name)
			break
		}
		out.Sandboxes = append(out.Sandboxes, objectView(sb))
	}
	return connect.NewResponse(out), nil
}

// pageKey is where a page ended: the last item's position (a sandbox's
// creation in milliseconds, a checkpoint's capture in microseconds) and
// name.
type pageKey struct {
	at   int64
	name string
}

// before reports whether the key sorts before sb.
func (k *pageKey) before(sb *fbv1.Sandbox) bool {
	return k.beforeAt(sb.CreationTimestamp.UnixMilli(), sb.Name)
}

// beforeAt reports whether the key sorts before the item at at named name.
func (k *pageKey) beforeAt(at int64, name string) bool {
	return at > k.at || at == k.at && name > k.name
}

const pagePrefix = "gw1:"

func pageToken(at int64, name string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(pagePrefix + strconv.FormatInt(at, 10) + ":" + name))
}

func parsePageToken(tok string) (*pageKey, error) {
	if tok == "" {
		return nil, nil
	}
	bad := fmt.Errorf("page_token: malformed or not this gateway's: %w", errdefs.ErrInvalidArgument)
	if len(tok) > 512 {
		return nil, bad
	}
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return nil, bad
	}
	rest, ok := strings.CutPrefix(string(b), pagePrefix)
	if !ok {
		return nil, bad
	}
	atStr, name, ok := strings.Cut(rest, ":")
	n, err := strconv.ParseInt(atStr, 10, 64)
	if !ok || err != nil {
		return nil, bad
	}
	return &pageKey{at: n, name: name}, nil
}
