package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/xds"
)

// The demo control plane serves the example file to hotproxy's client, and
// serves it again when the file changes.
func TestServesTheFileAndFollowsItsChanges(t *testing.T) {
	example, err := os.ReadFile("../../examples/xds-snapshot.json")
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "snapshot.json")
	replaceFile(t, file, example)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- run(ctx, l, file, 100*time.Millisecond) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-served:
		case <-time.After(10 * time.Second):
			t.Error("the control plane did not stop within 10s")
		}
	})

	for _, p := range []xds.Protocol{xds.ProtocolSotW, xds.ProtocolDelta} {
		t.Run(string(p), func(t *testing.T) {
			replaceFile(t, file, example)
			c, err := xds.New(xds.Config{Dial: xds.DialTarget(addr, nil), NodeID: "demo", Protocol: p,
				BackoffBase: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond, SecretDir: filepath.Join(t.TempDir(), "s")})
			if err != nil {
				t.Fatal(err)
			}
			cctx, ccancel := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() { c.Run(cctx); close(done) }()
			defer func() { ccancel(); <-done }()
			next := func() *xds.Update {
				t.Helper()
				select {
				case u := <-c.Updates():
					return u
				case err := <-served:
					served <- err // for the cleanup's wait
					t.Fatalf("the control plane stopped: %v", err)
				case <-time.After(10 * time.Second):
					t.Fatal("no Update within 10s")
				}
				return nil
			}
			// Wait (bounded) for the example's own state: a previous
			// subtest may have left the file's other version served.
			var u *xds.Update
			for i := 0; i < 5; i++ {
				u = next()
				if len(u.State.Clusters) == 1 && slices.Equal(u.State.Clusters[0].Endpoints, []string{"127.0.0.1:9000"}) {
					break
				}
				u.Done(nil)
			}
			st := u.State
			if len(st.Listeners) != 1 || len(st.Listeners[0].Routes) != 2 || st.Listeners[0].Routes[1].Cluster != "backend" {
				t.Fatalf("listeners %+v", st.Listeners)
			}
			if len(st.Clusters) != 1 || st.Clusters[0].LBPolicy != "least_request" || !slices.Equal(st.Clusters[0].Endpoints, []string{"127.0.0.1:9000"}) {
				t.Fatalf("clusters %+v", st.Clusters)
			}
			u.Done(nil)

			changed := strings.Replace(strings.Replace(string(example), `"port_value": 9000`, `"port_value": 9001`, 1), `"version": "1"`, `"version": "2-`+string(p)+`"`, 1)
			replaceFile(t, file, []byte(changed))
			u = next()
			if eps := u.State.Clusters[0].Endpoints; !slices.Equal(eps, []string{"127.0.0.1:9001"}) {
				t.Fatalf("after the file changed: endpoints %v", eps)
			}
			u.Done(nil)
		})
	}
}

// replaceFile gives file its new content in one rename, as an operator's
// editor or deploy tool should: the control plane loads the file when it
// starts and whenever it changes, and a file rewritten in place can be
// read half-written (CI once saw the start read it empty and stop, "EOF",
// while a subtest was rewriting it).
func replaceFile(t *testing.T, file string, data []byte) {
	t.Helper()
	tmp := file + ".new"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, file); err != nil {
		t.Fatal(err)
	}
}

func TestLoadSnapshotRefusesMistakes(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ name, body, want string }{
		{"unknown key", `{"clusterz": []}`, `unknown field "clusterz"`},
		{"bad resource", `{"clusters": [{"name": "a", "lb_polcy": "MAGLEV"}]}`, `clusters[0]`},
		{"missing endpoints", `{"clusters": [{"name": "a", "type": "EDS", "eds_cluster_config": {"eds_config": {"ads": {}}}}]}`, `every cluster's endpoints`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_")+".json")
			os.WriteFile(f, []byte(tc.body), 0o600)
			_, err := LoadSnapshot(f)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one with %q", err, tc.want)
			}
		})
	}
}
