// Package filesystem holds the generated protobuf messages of E2B's envd filesystem
// service (proto/e2b/filesystem/filesystem.proto, Apache-2.0; `make proto` regenerates
// them), served by forkbox's E2B-compatible endpoint (internal/e2b).
package filesystem
