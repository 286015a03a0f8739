// Package deps pins the project's module dependencies while the packages that
// use them are being written. Delete once every import below is used elsewhere.
package deps

import (
	_ "github.com/google/go-containerregistry/pkg/v1/remote"
	_ "github.com/google/nftables"
	_ "github.com/google/uuid"
	_ "github.com/opencontainers/runtime-spec/specs-go"
	_ "github.com/schollz/progressbar/v3"
	_ "github.com/spf13/cobra"
	_ "github.com/vishvananda/netlink"
	_ "github.com/vishvananda/netns"
	_ "modernc.org/sqlite"
)
