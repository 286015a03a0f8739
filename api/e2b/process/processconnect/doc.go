// Package processconnect holds the generated Connect clients and handlers of
// E2B's envd process service (`make proto` regenerates them).
package processconnect
