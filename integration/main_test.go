package integration

import (
	"os"
	"testing"

	"github.com/hotproxy/hotproxy/integration/harness"
)

func TestMain(m *testing.M) {
	code := harness.Main(m)
	removeControlPlaneBinary() // xds_test.go
	os.Exit(code)
}
