//go:build linux

package steering

import (
	"net"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// BenchmarkAccept is the accept path with and without the program: a
// group of 4 sockets, each accepted on by its own goroutine (a worker)
// that counts the connection in and out as the workers do and closes it;
// clients in parallel connect and wait for the close. One op is one
// connection: SYN to the program (or the kernel's hash), accept, close.
//
//	go test -run '^$' -bench Accept -benchtime 20000x ./workers/steering/
func BenchmarkAccept(b *testing.B) {
	for _, bc := range []struct {
		name  string
		steer bool
		mode  Mode
	}{
		{"kernel", false, 0},
		{"least_conn", true, LeastConn},
		{"hash", true, Hash},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var g *Group
			if bc.steer {
				requireSteering(b)
				var err error
				if g, err = New(bc.mode); err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { g.Close() })
			}
			first := listenReusePort(b, "127.0.0.1:0")
			addr := first.Addr().String()
			lns := []*net.TCPListener{first}
			for range 3 {
				lns = append(lns, listenReusePort(b, addr))
			}
			if g != nil {
				conns := make([]syscall.Conn, len(lns))
				for i, l := range lns {
					conns[i] = l
				}
				if err := g.Attach(conns); err != nil {
					b.Fatal(err)
				}
			}
			for i, l := range lns {
				go func() {
					active := g.Active(i)
					for {
						c, err := l.Accept()
						if err != nil {
							return
						}
						if active != nil {
							active.Add(1)
							active.Add(^uint64(0))
						}
						c.Close()
					}
				}()
			}
			if g != nil {
				// The program's own time per run, from the kernel
				// (kernel.bpf_stats_enabled while this holds it): a
				// figure the machine's noise does not drown.
				stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
				if err != nil {
					b.Fatalf("enable BPF run-time stats: %v", err)
				}
				defer stats.Close()
			}
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				buf := make([]byte, 1)
				for pb.Next() {
					c, err := net.Dial("tcp", addr)
					if err != nil {
						b.Error(err)
						return
					}
					c.Read(buf) // EOF: accepted and closed
					c.Close()
				}
			})
			b.StopTimer()
			if g != nil {
				st, err := g.prog.Stats()
				if err != nil {
					b.Fatal(err)
				}
				if st.RunCount > 0 {
					b.ReportMetric(float64(st.Runtime.Nanoseconds())/float64(st.RunCount), "prog-ns/run")
				}
			}
		})
	}
}
