//go:build !amd64

package agent

// limitHelperNative says limitHelperCode runs on this architecture: here
// it does not, and the agent's Go helper mode applies the pids limit.
const limitHelperNative = false
