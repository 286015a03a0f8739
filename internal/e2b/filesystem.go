package e2b

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io/fs"
	"path"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/forkbox/forkbox/api/e2b/filesystem"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/agent"
)

// Bounds of the watchers of CreateWatcher.
const (
	// maxWatchers bounds a sandbox's watchers.
	maxWatchers = 16
	// maxWatcherEvents bounds the events a watcher keeps until
	// GetWatcherEvents takes them; past it the oldest are dropped.
	maxWatcherEvents = 1000
)

// filesystemService is envd's filesystem.Filesystem on the agent's file
// operations and polling watch (see internal/agent/fsops.go, watch.go).
type filesystemService struct{ s *Server }

func toEntry(e agent.Entry, p string) *filesystem.EntryInfo {
	t := filesystem.FileType_FILE_TYPE_FILE
	switch {
	case e.Mode.IsDir():
		t = filesystem.FileType_FILE_TYPE_DIRECTORY
	case e.Mode&fs.ModeSymlink != 0:
		t = filesystem.FileType_FILE_TYPE_SYMLINK
	}
	out := &filesystem.EntryInfo{Name: e.Name, Type: t, Path: p, Size: e.Size, Mode: uint32(e.Mode.Perm()),
		Permissions: e.Mode.String(), Owner: e.Owner, Group: e.Group, ModifiedTime: timestamppb.New(e.ModTime)}
	if e.Symlink != "" {
		out.SymlinkTarget = &e.Symlink
	}
	return out
}

func (f *filesystemService) Stat(ctx context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	sb := sandboxOf(ctx)
	if err := checkUser(req.Header()); err != nil {
		return nil, err
	}
	p := resolve(sb, req.Msg.Path)
	e, err := f.s.d.Stat(ctx, sb.ID, p)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: toEntry(e, e.Path)}), nil
}

func (f *filesystemService) MakeDir(ctx context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	sb := sandboxOf(ctx)
	if err := checkUser(req.Header()); err != nil {
		return nil, err
	}
	e, err := f.s.d.MakeDir(ctx, sb.ID, resolve(sb, req.Msg.Path))
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.MakeDirResponse{Entry: toEntry(e, e.Path)}), nil
}

func (f *filesystemService) Move(ctx context.Context, req *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
	sb := sandboxOf(ctx)
	if err := checkUser(req.Header()); err != nil {
		return nil, err
	}
	e, err := f.s.d.Move(ctx, sb.ID, resolve(sb, req.Msg.Source), resolve(sb, req.Msg.Destination))
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.MoveResponse{Entry: toEntry(e, e.Path)}), nil
}

func (f *filesystemService) ListDir(ctx context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	sb := sandboxOf(ctx)
	if err := checkUser(req.Header()); err != nil {
		return nil, err
	}
	depth := int(req.Msg.Depth)
	if depth == 0 {
		depth = 1
	}
	ents, err := f.s.d.Walk(ctx, sb.ID, resolve(sb, req.Msg.Path), depth)
	if err != nil {
		return nil, err
	}
	out := &filesystem.ListDirResponse{}
	for _, e := range ents {
		out.Entries = append(out.Entries, toEntry(e, e.Path))
	}
	return connect.NewResponse(out), nil
}

func (f *filesystemService) Remove(ctx context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	sb := sandboxOf(ctx)
	if err := checkUser(req.Header()); err != nil {
		return nil, err
	}
	if err := f.s.d.Remove(ctx, sb.ID, resolve(sb, req.Msg.Path)); err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.RemoveResponse{}), nil
}

var eventTypes = map[string]filesystem.EventType{
	agent.WatchCreate: filesystem.EventType_EVENT_TYPE_CREATE,
	agent.WatchWrite:  filesystem.EventType_EVENT_TYPE_WRITE,
	agent.WatchRemove: filesystem.EventType_EVENT_TYPE_REMOVE,
	agent.WatchRename: filesystem.EventType_EVENT_TYPE_RENAME,
	agent.WatchChmod:  filesystem.EventType_EVENT_TYPE_CHMOD,
}

// toEvent is envd's event: the name relative to the watched directory.
func toEvent(root string, e agent.WatchEvent, withEntry bool) *filesystem.FilesystemEvent {
	ev := &filesystem.FilesystemEvent{Name: e.Entry.Path, Type: eventTypes[e.Op]}
	if withEntry {
		ev.Entry = toEntry(e.Entry, path.Join(root, e.Entry.Path))
	}
	return ev
}

func checkWatch(allowNetworkMounts bool) error {
	if allowNetworkMounts {
		return notServed("watching network mounts")
	}
	return nil
}

func (f *filesystemService) WatchDir(ctx context.Context, req *connect.Request[filesystem.WatchDirRequest], stream *connect.ServerStream[filesystem.WatchDirResponse]) error {
	sb := sandboxOf(ctx)
	if err := checkUser(req.Header()); err != nil {
		return err
	}
	if err := checkWatch(req.Msg.AllowNetworkMounts); err != nil {
		return err
	}
	root := resolve(sb, req.Msg.Path)
	var mu sync.Mutex // Send is called by the watch and the keepalive ticker
	send := func(m *filesystem.WatchDirResponse) error {
		mu.Lock()
		defer mu.Unlock()
		return stream.Send(m)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(f.s.ctx, cancel)() // Shutdown ends the watch
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(keepAlive(req.Header()))
		defer t.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case <-t.C:
				if send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Keepalive{Keepalive: &filesystem.WatchDirResponse_KeepAlive{}}}) != nil {
					cancel()
					return
				}
			}
		}
	}()
	defer func() { cancel(); <-done }()
	var startErr error
	err := f.s.d.Watch(wctx, sb.ID, root, req.Msg.Recursive, func() {
		startErr = send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Start{Start: &filesystem.WatchDirResponse_StartEvent{}}})
		if startErr != nil {
			cancel()
		}
	}, func(evs []agent.WatchEvent) error {
		for _, e := range evs {
			if err := send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Filesystem{Filesystem: toEvent(root, e, req.Msg.IncludeEntry)}}); err != nil {
				return err
			}
		}
		return nil
	})
	if startErr != nil {
		return startErr
	}
	if ctx.Err() != nil {
		return nil // the client ended the watch
	}
	return err
}

// watcher is one CreateWatcher watch: its events wait for
// GetWatcherEvents.
type watcher struct {
	id, sandbox string
	cancel      context.CancelFunc
	mu          sync.Mutex
	events      []*filesystem.FilesystemEvent
	err         error
}

type watcherTable struct {
	mu sync.Mutex
	ws map[string]*watcher
}

func newWatcherTable() *watcherTable { return &watcherTable{ws: map[string]*watcher{}} }

func (t *watcherTable) get(sandbox, id string) (*watcher, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if w := t.ws[id]; w != nil && w.sandbox == sandbox {
		return w, nil
	}
	return nil, fmt.Errorf("watcher %.64q not found: %w", id, errdefs.ErrNotFound)
}

func (t *watcherTable) remove(w *watcher) {
	t.mu.Lock()
	delete(t.ws, w.id)
	t.mu.Unlock()
	w.cancel()
}

// dropSandbox stops a sandbox's watchers (it is paused or killed).
func (t *watcherTable) dropSandbox(sandbox string) {
	t.mu.Lock()
	var list []*watcher
	for _, w := range t.ws {
		if w.sandbox == sandbox {
			list = append(list, w)
		}
	}
	t.mu.Unlock()
	for _, w := range list {
		t.remove(w)
	}
}

func (f *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[filesystem.CreateWatcherRequest]) (*connect.Response[filesystem.CreateWatcherResponse], error) {
	sb := sandboxOf(ctx)
	if err := checkUser(req.Header()); err != nil {
		return nil, err
	}
	if err := checkWatch(req.Msg.AllowNetworkMounts); err != nil {
		return nil, err
	}
	t := f.s.watchers
	b := make([]byte, 8)
	rand.Read(b)
	wctx, cancel := context.WithCancel(f.s.ctx)
	w := &watcher{id: "w-" + hex.EncodeToString(b), sandbox: sb.ID, cancel: cancel}
	t.mu.Lock()
	n := 0
	for _, o := range t.ws {
		if o.sandbox == sb.ID {
			n++
		}
	}
	if n >= maxWatchers {
		t.mu.Unlock()
		cancel()
		return nil, fmt.Errorf("sandbox %s has %d watchers, the most it may: %w", sb.ID, maxWatchers, errdefs.ErrResourceExhausted)
	}
	t.ws[w.id] = w
	t.mu.Unlock()
	root := resolve(sb, req.Msg.Path)
	started := make(chan struct{})
	ended := make(chan error, 1)
	f.s.goOwned(func() {
		err := f.s.d.Watch(wctx, sb.ID, root, req.Msg.Recursive, func() { close(started) }, func(evs []agent.WatchEvent) error {
			w.mu.Lock()
			defer w.mu.Unlock()
			for _, e := range evs {
				w.events = append(w.events, toEvent(root, e, req.Msg.IncludeEntry))
			}
			if over := len(w.events) - maxWatcherEvents; over > 0 {
				w.events = append(w.events[:0:0], w.events[over:]...)
			}
			return nil
		})
		w.mu.Lock()
		w.err = err
		w.mu.Unlock()
		ended <- err
	})
	select {
	case <-started:
	case err := <-ended:
		t.remove(w)
		if err == nil {
			err = fmt.Errorf("watch %s ended before it started: %w", root, errdefs.ErrNotFound)
		}
		return nil, err
	}
	return connect.NewResponse(&filesystem.CreateWatcherResponse{WatcherId: w.id}), nil
}

func (f *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[filesystem.GetWatcherEventsRequest]) (*connect.Response[filesystem.GetWatcherEventsResponse], error) {
	w, err := f.s.watchers.get(sandboxOf(ctx).ID, req.Msg.WatcherId)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	evs, werr := w.events, w.err
	w.events = nil
	w.mu.Unlock()
	if len(evs) == 0 && werr != nil && !isClass(werr, errdefs.ErrCanceled) {
		return nil, werr
	}
	return connect.NewResponse(&filesystem.GetWatcherEventsResponse{Events: evs}), nil
}

func (f *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[filesystem.RemoveWatcherRequest]) (*connect.Response[filesystem.RemoveWatcherResponse], error) {
	w, err := f.s.watchers.get(sandboxOf(ctx).ID, req.Msg.WatcherId)
	if err != nil {
		return nil, err
	}
	f.s.watchers.remove(w)
	return connect.NewResponse(&filesystem.RemoveWatcherResponse{}), nil
}
