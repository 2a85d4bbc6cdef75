package hotrestart

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/internal/unixsock"
)

// TestPathRestartSocketNeedsPrivateDir (issue 20, item 8, for
// hot_restart.socket_dir): a generation listens, and a successor dials,
// only in a directory of this user that nobody else may write. A socket
// planted in a world-writable directory is never dialled: the successor
// finds no parent (naming the directory), and the planted listener sees
// no connection.
func TestPathRestartSocketNeedsPrivateDir(t *testing.T) {
	shared := filepath.Join(t.TempDir(), "shared")
	if err := os.Mkdir(shared, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(shared, 0o1777); err != nil {
		t.Fatal(err)
	}
	addr := Address(1, 0, shared)
	// The listening side: every restart socket is bound by unixsock.Listen.
	if _, err := unixsock.Listen("unixpacket", addr); err == nil || !strings.Contains(err.Error(), shared) {
		t.Errorf("listen in a world-writable directory: %v; want a refusal naming it", err)
	}
	planted, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: addr, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer planted.Close()
	_, err = Dial(addr, Identity{PID: os.Getpid()}, 2*time.Second)
	if !errors.Is(err, ErrNoParent) || !strings.Contains(err.Error(), shared) {
		t.Errorf("Dial into a world-writable directory: %v; want ErrNoParent naming %s", err, shared)
	}
	planted.SetDeadline(time.Now().Add(100 * time.Millisecond))
	if c, err := planted.Accept(); err == nil {
		c.Close()
		t.Error("the planted listener got a connection")
	}
}
