package image

import (
	"fmt"
	"path"
	"strings"

	"github.com/forkbox/forkbox/errdefs"
)

const (
	whiteoutPrefix = ".wh."
	whiteoutOpaque = ".wh..wh..opq"
	whiteoutMeta   = ".wh..wh."
	nameMax        = 255 // NAME_MAX: one path component
)

// cleanName validates a tar entry name (or hardlink target) and returns it
// relative to the layer root, "." for the root itself. Like containerd and
// Docker, it joins absolute names under the root ("/" is the root, "/etc/x"
// is "etc/x"), as umoci and other tools write them. It refuses ".."
// components (no standard tool writes them, and they only ever mean to
// climb), NUL bytes, names longer than max bytes and components longer than
// NAME_MAX, and any component but the last that is a whiteout name: a
// whiteout has no children. (AUFS metadata directories, ".wh..wh.*", may:
// see inMeta.)
func cleanName(n string, max int) (string, error) {
	if len(n) > max {
		return "", fmt.Errorf("name is %d bytes, over the limit of %d: %w", len(n), max, errdefs.ErrInvalidArgument)
	}
	if strings.IndexByte(n, 0) >= 0 {
		return "", fmt.Errorf("name holds a NUL byte: %w", errdefs.ErrInvalidArgument)
	}
	parts := strings.Split(n, "/")
	for i, part := range parts {
		switch {
		case part == "..":
			return "", fmt.Errorf("path climbs out with \"..\": %w", errdefs.ErrInvalidArgument)
		case len(part) > nameMax:
			return "", fmt.Errorf("path component is %d bytes, over %d: %w", len(part), nameMax, errdefs.ErrInvalidArgument)
		case strings.HasPrefix(part, whiteoutPrefix) && !isMeta(part) && i < len(parts)-1 && !allEmpty(parts[i+1:]):
			return "", fmt.Errorf("whiteout %q cannot have children: %w", part, errdefs.ErrInvalidArgument)
		}
	}
	rel := path.Clean("/" + n)[1:]
	if rel == "" {
		return ".", nil
	}
	return rel, nil
}

// inMeta reports whether a cleaned name is, or is below, AUFS metadata
// (".wh..wh.plnk/..."): such entries are skipped, as Docker does.
func inMeta(rel string) bool {
	for _, part := range strings.Split(rel, "/") {
		if isMeta(part) {
			return true
		}
	}
	return false
}

// isMeta: AUFS metadata other than the opaque marker.
func isMeta(part string) bool {
	return strings.HasPrefix(part, whiteoutMeta) && part != whiteoutOpaque
}

// allEmpty reports whether every part is "" or "." (what a trailing slash or
// "/." leaves after a split).
func allEmpty(parts []string) bool {
	for _, p := range parts {
		if p != "" && p != "." {
			return false
		}
	}
	return true
}

// whiteout classifies the last component of a cleaned entry name: an opaque
// marker, other AUFS metadata to skip, the whiteout of a sibling named
// target, or none of these. A whiteout whose target is not a plain name
// (".wh.", ".wh..", ".wh...") is an InvalidArgument error: it would name the
// directory itself or its parent.
func whiteout(base string) (kind whiteoutKind, target string, err error) {
	switch {
	case base == whiteoutOpaque:
		return whOpaque, "", nil
	case strings.HasPrefix(base, whiteoutMeta):
		return whMeta, "", nil
	case strings.HasPrefix(base, whiteoutPrefix):
		t := strings.TrimPrefix(base, whiteoutPrefix)
		if t == "" || t == "." || t == ".." || strings.Contains(t, "/") {
			return 0, "", fmt.Errorf("whiteout %q names no file: %w", base, errdefs.ErrInvalidArgument)
		}
		return whFile, t, nil
	}
	return whNone, "", nil
}

type whiteoutKind int

const (
	whNone whiteoutKind = iota
	whOpaque
	whMeta
	whFile
)
