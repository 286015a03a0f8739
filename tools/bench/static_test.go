package main

import (
	"context"
	"testing"
)

// TestStaticProgramsBuild compiles the programs the bench copies into
// sandboxes: they live in string constants, so nothing else compiles them
// before a bench run.
func TestStaticProgramsBuild(t *testing.T) {
	for name, src := range map[string]string{"memhog": memhogSource, "spawnfloor": spawnFloorSource} {
		if b, err := buildStatic(context.Background(), t.TempDir(), name, src); err != nil || len(b) == 0 {
			t.Errorf("%s: %d bytes, %v", name, len(b), err)
		}
	}
}
