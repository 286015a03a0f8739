package clustertest

import (
	"os"
	"testing"
)

var plane Plane

func TestMain(m *testing.M) { os.Exit(Main(m, &plane)) }
