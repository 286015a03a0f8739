// Package filesystemconnect holds the generated Connect clients and handlers of
// E2B's envd filesystem service (`make proto` regenerates them).
package filesystemconnect
