package hotrestart

import (
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// linkPair opens both ends of a link in this process: the test plays the
// supervisor (it made the pair, so SO_PEERCRED names this pid) and the
// generation.
func linkPair(tb testing.TB, keeps bool, supervisorPID int) (*SupervisorLink, *GenerationLink, error) {
	tb.Helper()
	sup, gen, err := NewLinkPair()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { sup.Close() })
	accepted := make(chan *GenerationLink, 1)
	go func() {
		gl, err := AcceptGenerationLink(sup, Identity{PID: os.Getpid()}, keeps, 5*time.Second)
		if err != nil {
			tb.Log(err)
		}
		accepted <- gl
	}()
	sl, err := OpenSupervisorLink(gen, supervisorPID, Identity{PID: os.Getpid(), Epoch: 3}, 5*time.Second)
	if err != nil {
		sup.Close()
		<-accepted
		return nil, nil, err
	}
	tb.Cleanup(func() { sl.Close() })
	return sl, <-accepted, nil
}

// TestSupervisorKeepsAListeningSocketAndHandsItToTheNextGeneration: a
// socket kept over the link still holds the connections queued in it after
// the generation's own descriptor is closed, and the next generation
// accepts them from the copy it asks for.
func TestSupervisorKeepsAListeningSocketAndHandsItToTheNextGeneration(t *testing.T) {
	sl, gl, err := linkPair(t, true, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if !sl.KeepsSockets() {
		t.Fatal("the supervisor offered kept_sockets, the generation did not see it")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lf, _ := ln.(*net.TCPListener).File()
	sock := Socket{Network: "tcp", Address: ln.Addr().String(), Worker: 0, Role: RoleListener}
	if err := sl.Keep([]Socket{sock}, []*os.File{lf}); err != nil {
		t.Fatal(err)
	}
	lf.Close()
	req, err := gl.Next()
	if err != nil {
		t.Fatal(err)
	}
	if !req.Keep || len(req.Files) != 1 || req.Sockets[0] != sock {
		t.Fatalf("supervisor received %+v, want one kept socket %+v", req, sock)
	}
	// The generation dies: its descriptor goes. A client connects in
	// between; it is queued, not refused.
	ln.Close()
	client, err := net.DialTimeout("tcp", sock.Address, 2*time.Second)
	if err != nil {
		t.Fatalf("connecting while only the supervisor holds the socket: %v", err)
	}
	defer client.Close()

	// The next generation asks for the kept sockets.
	sl2, gl2, err := linkPair(t, true, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		r, err := gl2.Next()
		if err == nil && !r.GetSockets {
			t.Errorf("expected get_sockets, got %+v", r)
		}
		done <- gl2.SendSockets(req.Sockets, req.Files)
	}()
	socks, files, err := sl2.KeptSockets()
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	CloseFiles(req.Files)
	if len(files) != 1 || socks[0] != sock {
		t.Fatalf("next generation got %v", socks)
	}
	ln2, err := net.FileListener(files[0])
	files[0].Close()
	if err != nil {
		t.Fatal(err)
	}
	defer ln2.Close()
	ln2.(*net.TCPListener).SetDeadline(time.Now().Add(2 * time.Second))
	c, err := ln2.Accept()
	if err != nil {
		t.Fatalf("the connection queued while no generation served was not accepted by the next: %v", err)
	}
	c.Close()
}

// TestGenerationRefusesALinkNotMadeByItsSupervisor: the generation checks
// the link's maker against the supervisor pid it was told.
func TestGenerationRefusesALinkNotMadeByItsSupervisor(t *testing.T) {
	_, _, err := linkPair(t, true, os.Getpid()+1)
	if err == nil || !strings.Contains(err.Error(), "not this generation's supervisor") {
		t.Fatalf("want a refusal naming the supervisor, got %v", err)
	}
}

// TestNoSocketsKeptByASupervisorThatDoesNotOfferIt: keeping is negotiated.
func TestNoSocketsKeptByASupervisorThatDoesNotOfferIt(t *testing.T) {
	sl, _, err := linkPair(t, false, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if sl.KeepsSockets() {
		t.Fatal("kept_sockets seen though not offered")
	}
	if _, _, err := sl.KeptSockets(); err == nil {
		t.Fatal("asked a supervisor that keeps nothing for sockets without an error")
	}
}

// TestGenerationLinkRefusesGarbage: whatever a generation writes on its
// link, the supervisor's end returns an error (never panics) and closes
// the fds a bad message carried.
func TestGenerationLinkRefusesGarbage(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	lf, _ := ln.(*net.TCPListener).File()
	defer lf.Close()
	for _, tc := range []struct {
		name  string
		msg   string
		files int
	}{
		{"not json", "\x00\xffgarbage", 0},
		{"unknown type", `{"type":"take_everything"}`, 0},
		{"unknown field", `{"type":"keep_sockets","sockets":[],"evil":1}`, 0},
		{"fewer fds than sockets", `{"type":"keep_sockets","sockets":[{"network":"tcp","address":"a:1","worker":0,"role":"listener"},{"network":"tcp","address":"a:1","worker":1,"role":"listener"}]}`, 1},
		{"fds on a request without sockets", `{"type":"get_sockets"}`, 1},
		{"socket without a role", `{"type":"keep_sockets","sockets":[{"network":"tcp","address":"a:1","worker":0}]}`, 1},
		{"a hello again", `{"type":"hello","version":"1.4","identity":{"pid":1,"epoch":0,"binary_version":"x"}}`, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sl, gl, err := linkPair(t, true, os.Getpid())
			if err != nil {
				t.Fatal(err)
			}
			before := openFDs(t)
			var files []*os.File
			for range tc.files {
				files = append(files, lf)
			}
			raw := &conn{uc: sl.c.uc, timeout: time.Second}
			if err := rawSend(raw, []byte(tc.msg), files); err != nil {
				t.Fatal(err)
			}
			if _, err := gl.Next(); err == nil {
				t.Fatalf("%s accepted", tc.msg)
			}
			if after := openFDs(t); after > before {
				t.Fatalf("%d fds open after a refused message, %d before: the message's fds leaked", after, before)
			}
		})
	}
}

// rawSend writes b as one datagram with files attached, unchecked.
func rawSend(c *conn, b []byte, files []*os.File) error {
	var oob []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			fds[i] = int(f.Fd())
		}
		oob = unix.UnixRights(fds...)
	}
	_, _, err := c.uc.WriteMsgUnix(b, oob, nil)
	return err
}

func openFDs(tb testing.TB) int {
	tb.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		tb.Fatal(err)
	}
	return len(ents)
}
