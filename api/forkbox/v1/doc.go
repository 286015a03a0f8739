// Package forkboxv1 holds the generated protobuf messages of the forkbox v1
// API (proto/forkbox/v1/forkbox.proto; `make proto` regenerates them).
package forkboxv1
