package integration

import (
	"os"
	"testing"

	"github.com/hotproxy/hotproxy/integration/harness"
)

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }
