package transfer

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/httpserve"
)

// ServerOptions configure a Server.
type ServerOptions struct {
	Identity *Identity
	Trust    Trust
	// Grants says which checkpoints each peer may pull: being trusted
	// (a node) is not enough, a peer gets only what it has a reason to
	// hold.
	Grants Grants
	Local  *Local
	// Timeout bounds one pull (default 30m).
	Timeout time.Duration
	// MaxConcurrent pulls served at once (default 4), of which one peer
	// takes at most half (at least one); more are refused with 503 and
	// retried by their receivers. Image requests have twice as many.
	MaxConcurrent int
	// BodyTimeout bounds the read of a request's body (default 30s); it
	// is read before the request takes a slot (slots.go).
	BodyTimeout time.Duration
	// MaxFiles bounds the files of a memory image sent (default 256).
	MaxFiles int
	Log      *slog.Logger
}

// Server serves the checkpoints of one node to its peers.
type Server struct {
	o   ServerOptions
	srv *http.Server
	// pulls and images are the slots of pulls and of image requests
	// (slots.go): images never wait for checkpoints.
	pulls, images *slots
	wg            sync.WaitGroup
	ln            net.Listener
	once          sync.Once
}

// NewServer makes a server; Start runs it.
func NewServer(o ServerOptions) (*Server, error) {
	if o.Identity == nil || o.Trust == nil || o.Grants == nil || o.Local == nil {
		return nil, fmt.Errorf("transfer server: an identity, a trust, grants and a local store are required: %w", errdefs.ErrInvalidArgument)
	}
	if o.Timeout == 0 {
		o.Timeout = 30 * time.Minute
	}
	if o.MaxConcurrent == 0 {
		o.MaxConcurrent = 4
	}
	if o.MaxFiles == 0 {
		o.MaxFiles = 256
	}
	if o.BodyTimeout == 0 {
		o.BodyTimeout = 30 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	s := &Server{o: o, pulls: newSlots(o.MaxConcurrent, o.MaxConcurrent/2), images: newSlots(2*o.MaxConcurrent, o.MaxConcurrent)}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/pull", s.pull)
	s.imageRoutes(mux) // images.go
	s.srv = httpserve.New(bounded(o.BodyTimeout, mux), false)
	s.srv.ErrorLog = slog.NewLogLogger(o.Log.Handler(), slog.LevelDebug)
	return s, nil
}

// Start listens on addr (host:port) with mutual TLS and serves until
// Close; it returns the address bound.
func (s *Server) Start(addr string) (net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("transfer listener %s: %v: %w", addr, err, errdefs.ErrUnavailable)
	}
	s.ln = tls.NewListener(ln, serverTLS(s.o.Identity, s.o.Trust))
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := s.srv.Serve(s.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.o.Log.Error("transfer server stopped", slog.Any("err", err))
		}
	}()
	return ln.Addr(), nil
}

// Close stops the server, cutting pulls in flight, and waits for it.
func (s *Server) Close() error {
	var err error
	s.once.Do(func() {
		err = s.srv.Close()
		s.wg.Wait()
	})
	return err
}

// peerOf is the node whose certificate r came with (the handshake
// checked it; it may have been withdrawn since).
func (s *Server) peerOf(r *http.Request) (string, error) {
	if r.TLS == nil || len(r.TLS.PeerCertificates) != 1 {
		return "", fmt.Errorf("no client certificate: %w", errdefs.ErrPermissionDenied)
	}
	return s.o.Trust.NodeOf(r.Context(), r.TLS.PeerCertificates[0].Raw)
}

// pull serves one pull: the peer is identified and its request read
// (bounded in size and time) and granted before it takes a slot.
func (s *Server) pull(w http.ResponseWriter, r *http.Request) {
	peer, err := s.peerOf(r)
	var req Request
	if err == nil {
		if err = readBody(w, r, s.o.BodyTimeout, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.o.Timeout)
	defer cancel()
	log := s.o.Log.With(slog.String("checkpoint", truncate(req.Checkpoint, 200)), slog.String("peer", peer))
	if err == nil {
		err = s.grant(ctx, peer, req.Checkpoint)
	}
	if err != nil {
		log.WarnContext(ctx, "checkpoint pull refused", slog.Any("err", err))
		w.Header().Set("Content-Type", "application/octet-stream")
		_ = writeJSON(w, frameError, remoteError{Class: errdefs.ClassName(err), Message: truncate(err.Error(), 4096)})
		return
	}
	release, err := s.pulls.take(peer)
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	defer release()
	w.Header().Set("Content-Type", "application/octet-stream")
	start := time.Now()
	t, parent, err := s.send(ctx, w, peer, req)
	if err != nil {
		log.WarnContext(ctx, "checkpoint send failed", slog.Any("err", err))
		_ = writeJSON(w, frameError, remoteError{Class: errdefs.ClassName(err), Message: truncate(err.Error(), 4096)})
		return
	}
	log.InfoContext(ctx, "checkpoint sent", slog.String("parent", parent), slog.Int64("send_bytes", t.SendBytes),
		slog.Int64("file_bytes", t.FileBytes), slog.Duration("took", time.Since(start)))
}

// grant refuses, PermissionDenied, a pull that Grants do not allow;
// the grant is asked under its own bound in time.
func (s *Server) grant(ctx context.Context, peer, checkpoint string) error {
	if err := validID(checkpoint); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, grantTimeout)
	defer cancel()
	err := s.o.Grants.MayPull(ctx, peer, checkpoint)
	switch {
	case err == nil, errdefs.IsPermissionDenied(err):
		return err
	case errdefs.IsUnavailable(err):
		return fmt.Errorf("cannot tell now whether node %s may pull checkpoint %s: %w", peer, checkpoint, err)
	default: // whatever else went wrong, the answer is no
		return Denied(peer, checkpoint, err.Error())
	}
}

// grantTimeout bounds one Grants lookup.
const grantTimeout = 30 * time.Second

// send writes the frames of one pull to peer.
func (s *Server) send(ctx context.Context, w io.Writer, peer string, req Request) (trailer, string, error) {
	var t trailer
	if len(req.Have) > maxHave {
		return t, "", fmt.Errorf("%d ancestors named, limit %d: %w", len(req.Have), maxHave, errdefs.ErrInvalidArgument)
	}
	h, err := s.o.Local.held(ctx, req.Checkpoint)
	if err != nil {
		return t, "", err
	}
	if req.UUID != "" && h.info.Origin() != req.UUID {
		return t, "", fmt.Errorf("checkpoint %s here is subvolume %s, not %s: %w", h.id, h.info.Origin(), req.UUID, errdefs.ErrFailedPrecondition)
	}
	hd := header{Checkpoint: h.id, UUID: h.info.Origin(), Memory: h.memDir != "", Record: h.record}
	// The base of an incremental send is an ancestor of the checkpoint
	// here that the peer may pull itself: a diff from any other
	// checkpoint held here would show the peer what that one holds (its
	// names, its sizes).
	var parent *held
	for _, a := range req.Have {
		if a == h.id || !s.o.Local.ancestor(ctx, h.id, a) {
			continue
		}
		if err := s.grant(ctx, peer, a); err != nil {
			s.o.Log.DebugContext(ctx, "an ancestor named is no base for the peer", slog.String("checkpoint", truncate(a, 200)), slog.Any("err", err))
			continue
		}
		if p, err := s.o.Local.held(ctx, a); err == nil {
			parent = p
			hd.Parent, hd.ParentUUID = p.id, p.info.Origin()
			break
		}
	}
	var files []string
	if h.memDir != "" {
		if files, err = memFiles(h.memDir, s.o.MaxFiles); err != nil {
			return t, "", err
		}
	}
	if err := writeJSON(w, frameHeader, hd); err != nil {
		return t, "", err
	}
	args := []string{"send", "-q"}
	if parent != nil {
		args = append(args, "-p", parent.path)
	}
	cmd := exec.CommandContext(ctx, "btrfs", append(args, h.path)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stderr bytes.Buffer
	cmd.Stderr = &limitedBuffer{b: &stderr, max: 4096}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return t, "", fmt.Errorf("btrfs send: %v: %w", err, errdefs.ErrInternal)
	}
	if err := cmd.Start(); err != nil {
		return t, "", fmt.Errorf("btrfs send: %v: %w", err, errdefs.ErrUnavailable)
	}
	n, cerr := copyFrames(w, frameSend, out)
	werr := cmd.Wait()
	t.SendBytes = n
	if cerr != nil {
		return t, "", fmt.Errorf("stream the send: %w", cerr)
	}
	if werr != nil {
		return t, "", fmt.Errorf("btrfs send %s: %v: %s: %w", h.id, werr, bytes.TrimSpace(stderr.Bytes()), errdefs.ErrInternal)
	}
	for _, f := range files {
		n, err := sendFile(w, h.memDir, f)
		if err != nil {
			return t, "", err
		}
		t.Files++
		t.FileBytes += n
	}
	return t, hd.Parent, writeJSON(w, frameTrailer, t)
}

func sendFile(w io.Writer, dir, name string) (int64, error) {
	f, err := os.Open(filepath.Join(dir, name))
	if err != nil {
		return 0, fmt.Errorf("memory image file %s: %v: %w", name, err, errdefs.ErrInternal)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("memory image file %s: %v: %w", name, err, errdefs.ErrInternal)
	}
	if err := writeJSON(w, frameFile, fileHeader{Name: filepath.ToSlash(name), Size: st.Size()}); err != nil {
		return 0, err
	}
	n, err := copyFrames(w, frameData, io.LimitReader(f, st.Size()))
	if err == nil && n != st.Size() {
		err = fmt.Errorf("memory image file %s changed while sent: %w", name, errdefs.ErrInternal)
	}
	return n, err
}

// copyFrames copies r to w as frames of type typ.
func copyFrames(w io.Writer, typ byte, r io.Reader) (int64, error) {
	buf := make([]byte, sendChunk)
	var total int64
	for {
		n, err := io.ReadFull(r, buf)
		if n > 0 {
			if werr := writeFrame(w, typ, buf[:n]); werr != nil {
				return total, werr
			}
			total += int64(n)
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

// limitedBuffer keeps the first max bytes written to it.
type limitedBuffer struct {
	b   *bytes.Buffer
	max int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := l.max - l.b.Len(); room > 0 {
		l.b.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}
