package transfer

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"

	"github.com/forkbox/forkbox/errdefs"
)

// Frames: [1 byte type][4 bytes big-endian length][payload].
const (
	frameHeader  = 'H' // JSON header
	frameSend    = 'S' // send stream bytes
	frameFile    = 'F' // JSON fileHeader: a memory image file follows
	frameData    = 'D' // file bytes
	frameTrailer = 'T' // JSON trailer
	frameError   = 'E' // JSON remoteError: the sender failed

	maxFrame     = 1 << 20
	maxJSONFrame = maxFrame // a header carries the ledger record
	sendChunk    = 256 << 10
)

// Request asks a node for a checkpoint.
type Request struct {
	// Checkpoint is the checkpoint's local ID (the same on every node).
	Checkpoint string `json:"checkpoint"`
	// UUID is the subvolume UUID the checkpoint has on the node that took
	// it, as published (received copies carry it as their received UUID);
	// "" accepts whatever subvolume of that name the sender has.
	UUID string `json:"uuid,omitempty"`
	// Have are ancestors of the checkpoint the asking node holds, nearest
	// first: the sender sends incrementally from the first it holds too.
	Have []string `json:"have,omitempty"`
	// ImageDigest, the receiver's own and not sent, is the manifest digest
	// of the image EnsureImage made sure of for this checkpoint: the
	// ledger refuses a record that names another image.
	ImageDigest string `json:"-"`
}

// maxHave bounds Request.Have; maxRequest the request body.
const (
	maxHave    = 64
	maxRequest = 64 << 10
)

type header struct {
	Checkpoint string `json:"checkpoint"`
	UUID       string `json:"uuid"`
	Parent     string `json:"parent,omitempty"`
	ParentUUID string `json:"parentUUID,omitempty"`
	Memory     bool   `json:"memory,omitempty"`
	Record     []byte `json:"record"`
}

type fileHeader struct {
	Name string `json:"name"`
	Size int64  `json:"size"`
}

type trailer struct {
	SendBytes int64 `json:"sendBytes"`
	Files     int   `json:"files"`
	FileBytes int64 `json:"fileBytes"`
}

type remoteError struct {
	Class   string `json:"class"`
	Message string `json:"message"`
}

func writeFrame(w io.Writer, typ byte, p []byte) error {
	var h [5]byte
	h[0] = typ
	binary.BigEndian.PutUint32(h[1:], uint32(len(p)))
	if _, err := w.Write(h[:]); err != nil {
		return err
	}
	_, err := w.Write(p)
	return err
}

func writeJSON(w io.Writer, typ byte, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return writeFrame(w, typ, b)
}

// frameReader reads frames, counting every byte against a budget.
type frameReader struct {
	r      io.Reader
	budget int64 // bytes left
	total  int64
	buf    []byte
}

// next returns the next frame; its payload is valid until the next call.
func (f *frameReader) next() (byte, []byte, error) {
	var h [5]byte
	if _, err := io.ReadFull(f.r, h[:]); err != nil {
		return 0, nil, cut(err)
	}
	n := binary.BigEndian.Uint32(h[1:])
	if n > maxFrame {
		return 0, nil, fmt.Errorf("a frame of %d bytes, limit %d: %w", n, maxFrame, errdefs.ErrInvalidArgument)
	}
	if f.total+5+int64(n) > f.budget {
		return 0, nil, fmt.Errorf("the transfer goes past its limit of %d bytes: %w", f.budget, errdefs.ErrResourceExhausted)
	}
	f.total += 5 + int64(n)
	if cap(f.buf) < int(n) {
		f.buf = make([]byte, n)
	}
	p := f.buf[:n]
	if _, err := io.ReadFull(f.r, p); err != nil {
		return 0, nil, cut(err)
	}
	if h[0] == frameError {
		var re remoteError
		if json.Unmarshal(p, &re) != nil {
			return 0, nil, fmt.Errorf("the sender failed: %w", errdefs.ErrUnavailable)
		}
		class := errdefs.FromClassName(re.Class, "")
		if class == nil || errdefs.Class(class) == errdefs.ErrUnknown {
			class = errdefs.ErrUnavailable
		}
		return 0, nil, fmt.Errorf("the sender failed: %s: %w", truncate(re.Message, 1024), errdefs.Class(class))
	}
	return h[0], p, nil
}

func (f *frameReader) json(p []byte, typ byte, v any) error {
	if len(p) > maxJSONFrame {
		return fmt.Errorf("frame %q is %d bytes, limit %d: %w", typ, len(p), maxJSONFrame, errdefs.ErrInvalidArgument)
	}
	if err := json.Unmarshal(p, v); err != nil {
		return fmt.Errorf("frame %q: %v: %w", typ, err, errdefs.ErrInvalidArgument)
	}
	return nil
}

func cut(err error) error {
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return fmt.Errorf("the stream was cut: %w", errdefs.ErrUnavailable)
	}
	return fmt.Errorf("read the stream: %v: %w", err, errdefs.ErrUnavailable)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
