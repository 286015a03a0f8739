package agent

// limitHelperNative says limitHelperCode runs on this architecture.
const limitHelperNative = true
