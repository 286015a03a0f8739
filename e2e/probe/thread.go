package main

import "runtime"

// runtimeLockOSThread wires the calling goroutine to its thread and never
// unlocks it, so the thread exits with the goroutine (a thread that changed
// namespaces is never reused).
func runtimeLockOSThread() { runtime.LockOSThread() }
