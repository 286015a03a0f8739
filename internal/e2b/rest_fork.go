package e2b

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/daemon"
	"github.com/forkbox/forkbox/internal/store"
)

// pause is E2B's pause: on gVisor the sandbox hibernates (memory and
// processes to disk, nothing held); elsewhere it is frozen in place (the
// cgroup freezer, memory kept). 409 when it is paused already.
func (s *Server) pause(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Memory *bool `json:"memory"`
	}
	if err := decode(w, r, &req); err != nil {
		fail(w, err)
		return
	}
	if req.Memory != nil && !*req.Memory {
		fail(w, notServed("pause with memory=false (a forkbox pause keeps memory)"))
		return
	}
	sb, err := s.sandbox(r)
	if err != nil {
		fail(w, err)
		return
	}
	if e2bState(sb.State) == "paused" {
		writeError(w, http.StatusConflict, fmt.Sprintf("sandbox %s is already paused", sb.ID))
		return
	}
	s.watchers.dropSandbox(sb.ID)
	if sb.Runtime == daemon.RuntimeGVisor {
		s.pauses.begin(sb.ID)
		if _, err = s.d.Hibernate(r.Context(), sb.ID); err != nil {
			s.pauses.end(sb.ID)
		}
	} else {
		_, err = s.d.Pause(r.Context(), sb.ID)
	}
	if err != nil {
		fail(w, err)
		return
	}
	w.Header().Set("X-Forkbox-Pause", map[bool]string{true: "hibernate", false: "freeze"}[sb.Runtime == daemon.RuntimeGVisor])
	w.WriteHeader(http.StatusNoContent)
}

// wake brings a paused sandbox back; it reports whether it was paused.
func (s *Server) wake(ctx context.Context, sb *store.Sandbox) (*store.Sandbox, bool, error) {
	var err error
	switch sb.State {
	case store.StateHibernated, store.StateHibernating:
		sb, err = s.d.Wake(ctx, sb.ID)
		if err == nil {
			s.pauses.end(sb.ID)
		}
		return sb, true, err
	case store.StatePaused:
		sb, err = s.d.Unpause(ctx, sb.ID)
		return sb, true, err
	}
	return sb, false, nil
}

type connectJSON struct {
	Timeout *int64 `json:"timeout"`
	Memory  *bool  `json:"memory"`
}

// connect resumes a paused sandbox (201) or answers for a running one
// (200); its deadline is only ever extended.
func (s *Server) connect(w http.ResponseWriter, r *http.Request) {
	s.resumeOrConnect(w, r, false)
}

// resume is the deprecated resume: 409 for a running sandbox.
func (s *Server) resume(w http.ResponseWriter, r *http.Request) {
	s.resumeOrConnect(w, r, true)
}

func (s *Server) resumeOrConnect(w http.ResponseWriter, r *http.Request, mustBePaused bool) {
	var req connectJSON
	if err := decode(w, r, &req); err != nil {
		fail(w, err)
		return
	}
	if req.Memory != nil && !*req.Memory {
		fail(w, notServed("resume with memory=false (a forkbox sandbox wakes with its memory)"))
		return
	}
	timeout, err := seconds(req.Timeout)
	if err != nil {
		fail(w, err)
		return
	}
	sb, err := s.sandbox(r)
	if err != nil {
		fail(w, err)
		return
	}
	if mustBePaused && e2bState(sb.State) != "paused" {
		writeError(w, http.StatusConflict, fmt.Sprintf("sandbox %s is not paused", sb.ID))
		return
	}
	sb, woke, err := s.wake(r.Context(), sb)
	if err == nil && timeout > 0 {
		err = s.extend(r.Context(), sb, timeout)
	}
	if err != nil {
		fail(w, err)
		return
	}
	status := http.StatusOK
	if woke {
		status = http.StatusCreated
	}
	reply(w, status, s.toSandbox(sb, s.info(r.Context(), sb).Template))
}

// forkResultJSON is E2B's SandboxForkResult, plus what forkbox captured.
type forkResultJSON struct {
	Sandbox *sandboxJSON  `json:"sandbox,omitempty"`
	Error   *apiError     `json:"error,omitempty"`
	Forkbox *forkInfoJSON `json:"forkbox,omitempty"`
}

// forkInfoJSON says what a fork captured: "filesystem+memory" (gVisor)
// or "filesystem" (crun), and the checkpoint the children started from.
type forkInfoJSON struct {
	Captured     string  `json:"captured"`
	CheckpointID string  `json:"checkpointID"`
	StartMS      float64 `json:"startMs"`
}

// fork is E2B's fork: count children of a running sandbox, with memory on
// gVisor and the filesystem elsewhere; one result per child.
func (s *Server) fork(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Timeout *int64 `json:"timeout"`
		Count   *int   `json:"count"`
	}
	if err := decode(w, r, &req); err != nil {
		fail(w, err)
		return
	}
	count := 1
	if req.Count != nil {
		count = *req.Count
	}
	if count < 1 || count > 100 {
		fail(w, fmt.Errorf("count %d: want 1 to 100: %w", count, errdefs.ErrInvalidArgument))
		return
	}
	timeout, err := seconds(req.Timeout)
	if err != nil {
		fail(w, err)
		return
	}
	if req.Timeout == nil {
		timeout = 15 * time.Second // E2B's default
	}
	sb, err := s.sandbox(r)
	if err != nil {
		fail(w, err)
		return
	}
	ctx := r.Context()
	parent := s.info(ctx, sb)
	res, err := s.d.Fork(ctx, daemon.ForkOptions{Source: sb.ID, Count: count, Memory: sb.Runtime == daemon.RuntimeGVisor,
		Overrides: daemon.Overrides{Timeout: timeout}})
	if err != nil {
		fail(w, err)
		return
	}
	out := make([]forkResultJSON, 0, len(res.Children))
	for _, c := range res.Children {
		info := &forkInfoJSON{Captured: res.Captured, CheckpointID: res.Checkpoint.ID, StartMS: c.StartMS}
		err := c.Err
		if err == nil {
			err = s.d.Store().PutE2BObject(ctx, &store.E2BObject{ID: c.Sandbox.ID, Kind: store.E2BKindSandbox,
				Template: parent.Template, Metadata: parent.Metadata})
		}
		if err != nil {
			out = append(out, forkResultJSON{Error: &apiError{Code: statusOf(err), Message: err.Error()}, Forkbox: info})
			continue
		}
		sj := s.toSandbox(c.Sandbox, parent.Template)
		out = append(out, forkResultJSON{Sandbox: &sj, Forkbox: info})
	}
	w.Header().Set("X-Forkbox-Captured", res.Captured)
	reply(w, http.StatusCreated, out)
}

// snapshotJSON is E2B's SnapshotInfo.
type snapshotJSON struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

// snapshot takes a forkbox checkpoint (filesystem) of a sandbox, usable as
// a templateID to create from. A name given twice names the newest.
func (s *Server) snapshot(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name string `json:"name"`
	}
	if err := decode(w, r, &req); err != nil {
		fail(w, err)
		return
	}
	if req.Name != "" {
		if err := checkID("snapshot name", req.Name); err != nil {
			fail(w, err)
			return
		}
	}
	sb, err := s.sandbox(r)
	if err != nil {
		fail(w, err)
		return
	}
	ctx := r.Context()
	ck, err := s.d.CheckpointWith(ctx, sb.ID, "e2b-snapshot", false)
	if err != nil {
		fail(w, err)
		return
	}
	if err := s.d.Store().PutE2BObject(ctx, &store.E2BObject{ID: ck.ID, Kind: store.E2BKindSnapshot, Name: req.Name, Source: sb.ID}); err != nil {
		fail(w, err)
		return
	}
	reply(w, http.StatusCreated, toSnapshot(&store.E2BObject{ID: ck.ID, Name: req.Name}))
}

func toSnapshot(o *store.E2BObject) snapshotJSON {
	names := []string{o.ID}
	if o.Name != "" {
		names = []string{o.Name}
	}
	return snapshotJSON{SnapshotID: o.ID, Names: names}
}

// snapshotByName returns the checkpoint id of the snapshot called name
// (its id, or its name: the newest of that name).
func (s *Server) snapshotByName(ctx context.Context, name string) (string, error) {
	list, err := s.d.Store().ListE2BObjects(ctx, store.E2BKindSnapshot)
	if err != nil {
		return "", err
	}
	found := ""
	for _, o := range list {
		if o.ID == name || (o.Name != "" && o.Name == strings.TrimSuffix(name, ":default")) {
			found = o.ID
		}
	}
	if found == "" {
		return "", fmt.Errorf("snapshot %q: %w", name, errdefs.ErrNotFound)
	}
	return found, nil
}

func (s *Server) snapshots(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	list, err := s.d.Store().ListE2BObjects(r.Context(), store.E2BKindSnapshot)
	if err != nil {
		fail(w, err)
		return
	}
	out := []snapshotJSON{}
	for _, o := range list {
		if sid := q.Get("sandboxID"); sid != "" && o.Source != sid {
			continue
		}
		if n := q.Get("name"); n != "" && o.Name != n && o.ID != n {
			continue
		}
		if _, err := s.d.GetCheckpoint(r.Context(), o.ID); err != nil {
			continue // deleted through forkbox's own API
		}
		out = append(out, toSnapshot(o))
	}
	reply(w, http.StatusOK, out)
}

func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := checkID("snapshot", id); err != nil {
		fail(w, err)
		return
	}
	ck, err := s.snapshotByName(r.Context(), id)
	if err != nil {
		fail(w, fmt.Errorf("%v (forkbox's E2B endpoint deletes snapshots only, not templates): %w", err, errdefs.ErrNotFound))
		return
	}
	if err := s.d.DeleteCheckpoint(r.Context(), ck); err != nil {
		fail(w, err)
		return
	}
	if err := s.d.Store().DeleteE2BObject(r.Context(), ck); err != nil {
		fail(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
