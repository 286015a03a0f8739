package agent

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"testing"
)

// FuzzReadFrame feeds arbitrary bytes to the frame decoder and the request
// header decoding the server does next. It must never panic, and never
// allocate more for a frame than its type's limit.
func FuzzReadFrame(f *testing.F) {
	hdr := func(typ, stream byte, n uint32, payload []byte) []byte {
		b := []byte{typ, stream, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(b[2:], n)
		return append(b, payload...)
	}
	f.Add(hdr(frameHeader, 0, 2, []byte("{}")))
	f.Add(hdr(frameHeader, 0, 38, []byte(`{"token":"t","op":"exec","exec":{"argv":["ls"]}}`)))
	f.Add(hdr(frameData, 1, 3, []byte("abc")))
	f.Add(hdr(frameEOF, 0, 0, nil))
	f.Add(hdr(frameData, 0, 0xffffffff, nil))
	f.Add(hdr(frameHeader, 0, maxHeaderFrame+1, nil))
	f.Add([]byte{frameHeader, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		for {
			fr, err := readFrame(r)
			if err != nil {
				return
			}
			limit := maxHeaderFrame
			if fr.typ == frameData {
				limit = maxDataFrame
			}
			if len(fr.payload) > limit || cap(fr.payload) > limit {
				t.Fatalf("frame of type %q holds %d bytes (cap %d), limit %d", fr.typ, len(fr.payload), cap(fr.payload), limit)
			}
			if fr.typ == frameHeader {
				var req request
				if json.Unmarshal(fr.payload, &req) == nil && req.Exec != nil {
					_, _ = req.Exec.argv()
					_, _, _ = mergeEnv(map[string]string{}, req.Exec.Env)
				}
				_, _ = checkPath(req.Path)
			}
		}
	})
}
