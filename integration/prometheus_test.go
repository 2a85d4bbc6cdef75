package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"

	"github.com/hotproxy/hotproxy/integration/harness"
)

// promQueryResult is the part of a Prometheus /api/v1/query answer the
// test reads.
type promQueryResult struct {
	Status string `json:"status"`
	Error  string `json:"error"`
	Data   struct {
		ResultType string `json:"resultType"`
		Result     []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		} `json:"result"`
	} `json:"data"`
}

// TestRealPrometheusHistogramQuantile runs a real Prometheus (Debian's
// prometheus package; .ci/run installs it) on loopback, scraping a
// proxy's /stats/prometheus every second, and asks it through its HTTP
// API for histogram_quantile of request latency per listener and per
// cluster: the answer has the listener and cluster labels and a latency
// that a loopback request can have. It skips, saying so, where the
// prometheus binary is missing.
func TestRealPrometheusHistogramQuantile(t *testing.T) {
	t.Parallel()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("prometheus is not installed (Debian: apt-get install prometheus; .ci/run installs it): the expfmt test in stats covers the format, not a real scrape")
	}
	b := harness.StartHTTPBackend(t, "b1")
	p := harness.Start(t, httpProxyConfig(b.Addr))
	sendRequests(t, p, 50)

	dir := t.TempDir()
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: hotproxy
    metrics_path: /stats/prometheus
    static_configs:
      - targets: ["%s"]
`, p.AdminAddr)), 0o600); err != nil {
		t.Fatal(err)
	}
	listen := harness.FreeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+listen, "--log.level=warn")
	var logs lockedBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel() // kills the process this test started, by its pid
		cmd.Wait()
		if t.Failed() {
			t.Logf("prometheus output:\n%s", logs.String())
		}
	})

	api := "http://" + listen
	client := &http.Client{Timeout: 5 * time.Second}
	query := func(q string) (promQueryResult, error) {
		var res promQueryResult
		resp, err := client.Get(api + "/api/v1/query?query=" + url.QueryEscape(q))
		if err != nil {
			return res, err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if err := json.Unmarshal(body, &res); err != nil {
			return res, fmt.Errorf("%s: %v", body, err)
		}
		if res.Status != "success" {
			return res, fmt.Errorf("query %q: %s", q, res.Error)
		}
		return res, nil
	}

	queries := []struct{ q, label, value string }{
		{`histogram_quantile(0.99, sum by (le, listener) (hotproxy_listener_downstream_rq_time_seconds_bucket))`, "listener", "web"},
		{`histogram_quantile(0.5, sum by (le, cluster) (hotproxy_cluster_upstream_rq_time_seconds_bucket))`, "cluster", "backend"},
	}
	deadline := time.Now().Add(60 * time.Second)
	for _, c := range queries {
		for {
			res, err := query(c.q)
			if err == nil && len(res.Data.Result) == 1 {
				r := res.Data.Result[0]
				s, _ := r.Value[1].(string)
				v, perr := strconv.ParseFloat(s, 64)
				if r.Metric[c.label] != c.value || perr != nil || !(v > 0 && v < 10) {
					t.Fatalf("%s = %v %q: want one series with %s=%q and a latency in (0, 10s)", c.q, r.Metric, s, c.label, c.value)
				}
				t.Logf("Prometheus: %s = %ss %v", c.q, s, r.Metric)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no answer to %s within 60s (last: %+v, %v)", c.q, res, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	// Every query of the example Grafana dashboard answers, with series
	// (its variables: every listener and cluster, a 10s rate window,
	// once Prometheus has three scrapes in it).
	sendRequests(t, p, 20)
	for {
		res, err := query(`count_over_time(up{job="hotproxy"}[10s]) >= 3`)
		if err == nil && len(res.Data.Result) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Prometheus did not scrape three times within 60s: %+v, %v", res, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, e := range dashboardExprs(t) {
		e = strings.NewReplacer("$__rate_interval", "10s", "$listener", ".*", "$cluster", ".*").Replace(e)
		res, err := query(e)
		if err != nil || len(res.Data.Result) == 0 {
			t.Errorf("dashboard query %s: %+v, %v: want series", e, res.Data, err)
		}
	}
	// The scrape itself is healthy: Prometheus reports up == 1 and no
	// sample it had to drop.
	res, err := query(`up{job="hotproxy"}`)
	if err != nil || len(res.Data.Result) != 1 || res.Data.Result[0].Value[1] != "1" {
		t.Fatalf("up{job=\"hotproxy\"}: %+v, %v", res, err)
	}
}

// lockedBuffer is a bytes.Buffer safe for the writes of a child's stdout
// and stderr copiers and a reader.
type lockedBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// dashboardExprs returns the PromQL expressions of the panels of
// examples/grafana-dashboard.json.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	root, err := harness.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "examples", "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("examples/grafana-dashboard.json: %v", err)
	}
	var out []string
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			out = append(out, tg.Expr)
		}
	}
	if len(out) < 10 {
		t.Fatalf("examples/grafana-dashboard.json: only %d queries", len(out))
	}
	return out
}

// TestGrafanaDashboardNames: every metric the example Grafana dashboard
// queries is a family a real proxy's /stats/prometheus has (a histogram's
// _bucket series by its family), so the dashboard is not built on names
// that do not exist.
func TestGrafanaDashboardNames(t *testing.T) {
	t.Parallel()
	b := harness.StartHTTPBackend(t, "b1")
	p := harness.Start(t, httpProxyConfig(b.Addr))
	sendRequests(t, p, 3)
	code, body := p.AdminGet("/stats/prometheus")
	if code != http.StatusOK {
		t.Fatalf("GET /stats/prometheus: %d %s", code, body)
	}
	var parser expfmt.TextParser
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	metric := regexp.MustCompile(`\bhotproxy_[a-z0-9_]+`)
	n := 0
	for _, e := range dashboardExprs(t) {
		for _, name := range metric.FindAllString(e, -1) {
			n++
			fam := strings.TrimSuffix(name, "_bucket")
			if fams[fam] == nil {
				t.Errorf("the dashboard queries %s (in %s), which the scrape does not have", name, e)
			}
		}
	}
	if n < 10 {
		t.Fatalf("only %d metric names in the dashboard", n)
	}
}
