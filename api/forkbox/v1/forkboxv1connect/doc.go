// Package forkboxv1connect holds the generated Connect clients and handlers
// of the forkbox v1 API (`make proto` regenerates them).
package forkboxv1connect
