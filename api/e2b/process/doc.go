// Package process holds the generated protobuf messages of E2B's envd process
// service (proto/e2b/process/process.proto, Apache-2.0; `make proto` regenerates
// them), served by forkbox's E2B-compatible endpoint (internal/e2b).
package process
