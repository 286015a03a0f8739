package agent

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/forkbox/forkbox/errdefs"
)

// listFrameBytes is the size past which a streamed list sends a data frame;
// one entry encodes to at most ~2 KiB, so frames stay far below maxDataFrame.
const listFrameBytes = 256 << 10

// handleList answers with the entries of a directory (not following
// symlinks of the entries), sorted by name.
//
// When the request asks for a stream (Client.ListFiles always does), the
// entries go out as data frames on stream 0, each a JSON array of FileInfo
// of at most about listFrameBytes, and the result frame carries their count
// only, so a directory of any size is listed. Otherwise (an older client)
// they all go in the result frame, which is limited to maxHeaderFrame.
func (s *Server) handleList(fw *frameWriter, hdr *request) error {
	p, err := checkPath(hdr.Path)
	if err != nil {
		return err
	}
	fi, err := os.Stat(p)
	if err != nil {
		return osErr("list", p, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("list %s: not a directory: %w", p, errdefs.ErrInvalidArgument)
	}
	ents, err := os.ReadDir(p)
	if err != nil {
		return osErr("list", p, err)
	}
	if len(ents) > MaxListEntries {
		return fmt.Errorf("list %s: more than %d entries: %w", p, MaxListEntries, errdefs.ErrResourceExhausted)
	}
	infos := func(yield func(FileInfo) bool) {
		for _, e := range ents {
			info, err := e.Info()
			if err != nil {
				continue // removed meanwhile
			}
			if !yield(FileInfo{Name: e.Name(), Size: info.Size(), Mode: info.Mode(),
				IsDir: info.IsDir(), ModTime: info.ModTime()}) {
				return
			}
		}
	}
	if !hdr.Stream {
		res := listResult{Entries: make([]FileInfo, 0, len(ents))}
		for fi := range infos {
			res.Entries = append(res.Entries, fi)
		}
		b, err := json.Marshal(res)
		if err != nil {
			return fmt.Errorf("list %s: encode: %v: %w", p, err, errdefs.ErrInternal)
		}
		if len(b) > maxHeaderFrame {
			return fmt.Errorf("list %s: %d entries do not fit in one frame: %w", p, len(res.Entries), errdefs.ErrResourceExhausted)
		}
		return fw.write(frameResult, 0, b)
	}
	buf := make([]byte, 0, listFrameBytes+4<<10)
	count, inFrame := 0, 0
	flush := func() error {
		if inFrame == 0 {
			return nil
		}
		buf = append(buf, ']')
		err := fw.write(frameData, streamStdin, buf)
		buf, inFrame = buf[:0], 0
		return err
	}
	for fi := range infos {
		b, err := json.Marshal(fi)
		if err != nil {
			return fmt.Errorf("list %s: encode: %v: %w", p, err, errdefs.ErrInternal)
		}
		if inFrame == 0 {
			buf = append(buf, '[')
		} else {
			buf = append(buf, ',')
		}
		buf = append(buf, b...)
		inFrame++
		count++
		if len(buf) >= listFrameBytes {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := flush(); err != nil {
		return err
	}
	return fw.writeJSON(frameResult, listResult{Count: count})
}
