package e2b

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strconv"
	"strings"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/agent"
)

// Bounds of /files.
const (
	// MaxFileBytes is the largest file /files moves (the agent's limit).
	MaxFileBytes = agent.MaxFileSize
	// maxUploadBody bounds an upload's body: one file of MaxFileBytes, and
	// what multipart framing adds around it.
	maxUploadBody = MaxFileBytes + 1<<20
	// maxUploadParts bounds the files of one multipart upload.
	maxUploadParts = 100
)

// uploadedJSON is envd's EntryInfo of an upload.
type uploadedJSON struct {
	Path string `json:"path"`
	Name string `json:"name"`
	Type string `json:"type"`
}

// filePath checks the path of a /files request: made absolute from the
// sandbox's working directory, no NUL, no ".." (the agent checks again).
func filePath(raw string) (string, error) {
	if raw == "" {
		return "", fmt.Errorf("path is required: %w", errdefs.ErrInvalidArgument)
	}
	if len(raw) > 4096 || strings.ContainsRune(raw, 0) {
		return "", fmt.Errorf("path %.64q is too long or holds NUL: %w", raw, errdefs.ErrInvalidArgument)
	}
	for _, el := range strings.Split(raw, "/") {
		if el == ".." {
			return "", fmt.Errorf("path %.128q contains \"..\": %w", raw, errdefs.ErrInvalidArgument)
		}
	}
	return raw, nil
}

// checkFileQuery refuses what /files does not serve: other users, and
// signed URLs (forkbox wants the access token on every request).
func checkFileQuery(r *http.Request) error {
	q := r.URL.Query()
	if u := q.Get("username"); u != "" && u != "root" {
		return fmt.Errorf("user %.32q: forkbox reads and writes files as root: %w", u, errdefs.ErrInvalidArgument)
	}
	if q.Get("signature") != "" {
		return notServed("signed file URLs (send X-Access-Token)")
	}
	return checkUser(r.Header)
}

// failFile answers a /files error: a file past the size bound is a 400
// (E2B's SDK: InvalidArgumentError), not a 429 (RateLimitError).
func failFile(w http.ResponseWriter, err error) {
	if errdefs.IsResourceExhausted(err) {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	fail(w, err)
}

// download is GET /files?path=: the file's bytes.
func (s *Server) download(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r.Context())
	if err := checkFileQuery(r); err != nil {
		failFile(w, err)
		return
	}
	p, err := filePath(r.URL.Query().Get("path"))
	if err != nil {
		failFile(w, err)
		return
	}
	data, err := s.d.ReadFile(r.Context(), sb.ID, resolve(sb, p))
	if err != nil {
		failFile(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": path.Base(p)}))
	if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") && len(data) > 0 {
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		zw.Write(data)
		zw.Close()
		return
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	w.Write(data)
}

// readBounded reads r to its end, failing past MaxFileBytes.
func readBounded(r io.Reader) ([]byte, error) {
	var buf bytes.Buffer
	n, err := io.Copy(&buf, io.LimitReader(r, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read upload: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if n > MaxFileBytes {
		return nil, fmt.Errorf("upload is more than %d bytes, the most forkbox moves in one file: %w", MaxFileBytes, errdefs.ErrResourceExhausted)
	}
	return buf.Bytes(), nil
}

// upload is POST /files: a multipart body of files (each part's file name
// is its path when the query names none), or one octet-stream body for the
// query's path. Parent directories are made; an existing file is replaced.
func (s *Server) upload(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r.Context())
	if err := checkFileQuery(r); err != nil {
		failFile(w, err)
		return
	}
	for k := range r.Header {
		if strings.HasPrefix(strings.ToLower(k), "x-metadata-") {
			fail(w, notServed("file metadata (X-Metadata-* headers)"))
			return
		}
	}
	body := io.Reader(http.MaxBytesReader(w, r.Body, maxUploadBody))
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(body)
		if err != nil {
			fail(w, fmt.Errorf("gzip body: %v: %w", err, errdefs.ErrInvalidArgument))
			return
		}
		defer zr.Close()
		body = zr
	} else if ce := r.Header.Get("Content-Encoding"); ce != "" && ce != "identity" {
		fail(w, fmt.Errorf("content encoding %.32q: want gzip or none: %w", ce, errdefs.ErrInvalidArgument))
		return
	}
	qpath := r.URL.Query().Get("path")
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var out []uploadedJSON
	put := func(raw string, data []byte) error {
		p, err := filePath(raw)
		if err != nil {
			return err
		}
		abs := resolve(sb, p)
		if err := s.d.WriteFile(r.Context(), sb.ID, abs, data, 0o644); err != nil {
			return err
		}
		out = append(out, uploadedJSON{Path: path.Clean(abs), Name: path.Base(abs), Type: "file"})
		return nil
	}
	switch mt {
	case "multipart/form-data":
		mr := multipart.NewReader(body, params["boundary"])
		for n := 0; ; n++ {
			part, err := mr.NextPart()
			if err == io.EOF {
				break
			}
			if err != nil {
				fail(w, fmt.Errorf("multipart body: %v: %w", err, errdefs.ErrInvalidArgument))
				return
			}
			if n == maxUploadParts {
				fail(w, fmt.Errorf("more than %d files in one upload: %w", maxUploadParts, errdefs.ErrInvalidArgument))
				return
			}
			if part.FormName() != "file" {
				part.Close()
				continue
			}
			p := qpath
			if p == "" {
				// Not part.FileName(): it keeps the base name only.
				_, dp, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
				p = dp["filename"]
			}
			data, err := readBounded(part)
			if err == nil {
				err = put(p, data)
			}
			if err != nil {
				failFile(w, err)
				return
			}
		}
	case "application/octet-stream":
		data, err := readBounded(body)
		if err == nil {
			err = put(qpath, data)
		}
		if err != nil {
			failFile(w, err)
			return
		}
	default:
		fail(w, fmt.Errorf("content type %.64q: want multipart/form-data or application/octet-stream: %w", mt, errdefs.ErrInvalidArgument))
		return
	}
	if len(out) == 0 {
		fail(w, fmt.Errorf("the upload holds no file: %w", errdefs.ErrInvalidArgument))
		return
	}
	reply(w, http.StatusOK, out)
}
