package upstream

import (
	"context"
	"errors"
	"testing"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/stats"
)

// TestMultiplexedRequests: PickEndpoints leaves out the previous try's
// endpoint, StartRequest holds max_requests and max_retries per request
// (not per connection) until its end, DialEndpoint's connection holds
// max_connections and upstream_cx_active until it is closed, and a refused
// connect is a ConnectError naming the endpoint, reported to outlier
// detection's count.
func TestMultiplexedRequests(t *testing.T) {
	be := newBackend(t, "b", nil)
	dead := closedAddr(t)
	cfg := config.Config{Clusters: []config.Cluster{{Name: "mx", Endpoints: []string{be.addr(), dead},
		CircuitBreakers: &config.CircuitBreakers{MaxRequests: 2, MaxConnections: 1, MaxPendingRequests: 5, MaxRetries: new(1)}}}}
	cfg.SetDefaults()
	c, err := NewCluster(cfg.Clusters[0])
	if err != nil {
		t.Fatal(err)
	}
	st, _ := stats.New(stats.Options{Workers: 1})
	wc := c.ForWorker(0)
	wc.BindStats(NewStats(st, "mx", 1))

	for avoid := range 2 {
		order, err := wc.PickEndpoints(0, avoid)
		if err != nil || len(order) != 1 || order[0] == avoid {
			t.Errorf("PickEndpoints(avoid %d) = %v, %v: want the other endpoint only", avoid, order, err)
		}
	}

	end1, err := wc.StartRequest(0, false)
	if err != nil {
		t.Fatal(err)
	}
	end2, err := wc.StartRequest(0, true)
	if err != nil {
		t.Fatal(err)
	}
	var oe *OverflowError
	if _, err := wc.StartRequest(0, false); !errors.As(err, &oe) || oe.Limit != "max_requests" {
		t.Fatalf("third request: %v, want max_requests overflow", err)
	}
	end2()
	end2() // idempotent
	if s := c.Status().Breakers; s.Requests != 1 || s.Retries != 0 {
		t.Errorf("after one request ended: %+v, want 1 request, 0 retries", s)
	}
	end1()

	ctx := context.Background()
	conn, err := wc.DialEndpoint(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wc.DialEndpoint(ctx, 0); !errors.As(err, &oe) || oe.Limit != "max_connections" {
		t.Fatalf("second connection: %v, want max_connections overflow", err)
	}
	if n := st.Gauge("cluster.mx.upstream_cx_active", stats.GaugeSum).Value(); n != 1 {
		t.Errorf("upstream_cx_active = %d, want 1", n)
	}
	conn.Close()
	conn.Close() // idempotent
	if s := c.Status().Breakers; s.Connections != 0 || s.Requests != 0 {
		t.Errorf("after the close: %+v", s)
	}
	if n := st.Gauge("cluster.mx.upstream_cx_active", stats.GaugeSum).Value(); n != 0 {
		t.Errorf("upstream_cx_active = %d after the close, want 0", n)
	}

	_, err = wc.DialEndpoint(ctx, 1)
	var ce *ConnectError
	if !errors.As(err, &ce) || len(ce.Tried) != 1 || ce.Tried[0] != dead {
		t.Fatalf("dial to the dead endpoint: %v, want a ConnectError naming %s", err, dead)
	}
	if n := c.Status().Endpoints[1].CxConnectFail; n != 1 {
		t.Errorf("cx_connect_fail of the dead endpoint = %d, want 1", n)
	}
}
