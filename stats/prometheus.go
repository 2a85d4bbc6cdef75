package stats

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/hotproxy/hotproxy/shm"
)

// Prometheus exposition, by Prometheus' own conventions
// (https://prometheus.io/docs/practices/naming/):
//
//   - every family is hotproxy_<scope>_<stat>, the listener, cluster or
//     worker a stat belongs to is a label (listener.web.downstream_rq_total
//     is hotproxy_listener_downstream_rq_total{listener="web"});
//   - every family has # HELP and # TYPE; every counter ends in _total;
//   - times are in seconds (the region records milliseconds: a *_time
//     histogram is hotproxy_..._time_seconds, its sum divided by 1000),
//     sizes in bytes;
//   - histograms are classic cumulative le buckets (PrometheusBuckets),
//     so that histogram_quantile works; the VictoriaMetrics vmrange form
//     stays available (PrometheusOptions.VMRange);
//   - the generations attached are hotproxy_generation_* series labelled
//     with slot, pid and epoch; hotproxy_generation_alive is the kernel's
//     word (shm.OwnerDead), not the owner table's.
//
// The le buckets are derived from the region's vmrange buckets, never
// stored: every generation records into the same fixed log layout (18
// buckets per decade) and the region adds them element-wise, so the merged
// counts are exact; each le bound below is an upper bound of that layout
// (every third one), so the cumulative count under it is a plain sum of
// whole stored buckets, exact too. Storing le buckets instead would need a
// second layout in the region and gain nothing.

// PrometheusBuckets are the le bounds of the classic histograms, in the
// exposed unit (seconds for times): six per decade from 10 µs to 100 s
// (10^(k/6)), then +Inf. They are bounds of the stored layout, so the
// counts under them are exact.
var PrometheusBuckets = func() []float64 {
	var out []float64
	for k := promMinK; k <= promMaxK; k++ {
		out = append(out, promBound(k))
	}
	return out
}()

const (
	promPerDecade = 6
	promMinK      = -5 * promPerDecade // 1e-5
	promMaxK      = 2 * promPerDecade  // 1e2
)

// promBound is 10^(k/6), exactly a power of ten when k is a multiple of 6.
func promBound(k int) float64 {
	if k%promPerDecade == 0 {
		return math.Pow10(k / promPerDecade)
	}
	return math.Pow(10, float64(k)/promPerDecade)
}

// storedUpper returns the index i (into bucketUpper) of the stored range
// bucket whose upper bound is 10^(k/6) in exposed units, for a stat stored
// in units 10^decades times smaller (3 for milliseconds exposed as
// seconds).
func storedUpper(k, decades int) int {
	// bucketUpper[n-1] = 10^(e10Min + n/18): solve for 10^(k/6 + decades).
	n := (k+decades*promPerDecade)*(bucketsPerDecimal/promPerDecade) - e10Min*bucketsPerDecimal
	return n - 1
}

// cumulativeLE returns the count at or under each PrometheusBuckets bound,
// then the total (+Inf), from stored buckets (see HistogramValue).
func cumulativeLE(buckets []uint64, decades int) []uint64 {
	out := make([]uint64, 0, len(PrometheusBuckets)+1)
	var run uint64
	next := 0 // stored bucket index not yet summed
	for k := promMinK; k <= promMaxK; k++ {
		// Range bucket i is stored at index i+1; index 0 holds the values
		// below the layout's range.
		last := storedUpper(k, decades) + 1
		for ; next <= last && next < len(buckets); next++ {
			run += buckets[next]
		}
		out = append(out, run)
	}
	for ; next < len(buckets); next++ {
		run += buckets[next]
	}
	return append(out, run)
}

// promStat describes how one stat is exposed.
type promStat struct {
	help string
	// unit: "" none; "ms" stored milliseconds, exposed in seconds
	// (_seconds, divided by 1000); "s" seconds; "bytes".
	unit string
}

// promKnown are the stats hotproxy writes, by their name with the
// listener, cluster or worker replaced by its scope ("listener." +
// stat): help text and unit. A stat not here is exposed all the same,
// with a help line naming it.
var promKnown = map[string]promStat{
	"server.live":                     {help: "1 while the newest live generation is LIVE; 0 while it starts or drains, or when no generation is alive", unit: ""},
	"server.state":                    {help: "Lifecycle state of the newest live generation: 0 live, 1 draining, 2 initializing"},
	"server.hot_restart_epoch":        {help: "Restart epoch of the newest live generation"},
	"server.uptime":                   {help: "Time since the newest live generation started (updated each flush)", unit: "s"},
	"server.concurrency":              {help: "Workers of the newest live generation"},
	"server.memory_allocated":         {help: "Heap bytes in objects of the newest live generation (Go runtime/metrics, each flush)", unit: "bytes"},
	"server.hot_restart.peer_refused": {help: "Peers the restart socket turned away (another uid, garbage, a second child, an unsupervised one)"},
	"server.max_connections":          {help: "Connection limit of the newest live generation"},

	"listener.downstream_cx_total":                       {help: "Connections accepted"},
	"listener.downstream_cx_active":                      {help: "Connections open"},
	"listener.downstream_cx_destroy":                     {help: "Connections closed"},
	"listener.downstream_cx_overflow":                    {help: "Connections closed at once, never served: over max_connections, or out of file descriptors"},
	"listener.downstream_rq_total":                       {help: "HTTP requests"},
	"listener.downstream_rq_http2_total":                 {help: "HTTP requests that came over HTTP/2 (also in downstream_rq_total)"},
	"listener.downstream_rq_active":                      {help: "HTTP requests in flight"},
	"listener.downstream_rq_1xx":                         {help: "Informational responses (a WebSocket upgrade's 101)"},
	"listener.downstream_rq_2xx":                         {help: "Responses with a 2xx status"},
	"listener.downstream_rq_3xx":                         {help: "Responses with a 3xx status"},
	"listener.downstream_rq_4xx":                         {help: "Responses with a 4xx status"},
	"listener.downstream_rq_5xx":                         {help: "Responses with a 5xx status"},
	"listener.downstream_rq_time":                        {help: "Time from a request's headers to the end of its response", unit: "ms"},
	"listener.downstream_cx_rx_bytes_total":              {help: "Bytes read from clients (plaintext on a TLS listener)"},
	"listener.downstream_cx_tx_bytes_total":              {help: "Bytes written to clients (plaintext on a TLS listener)"},
	"listener.ssl.handshake":                             {help: "TLS handshakes completed"},
	"listener.ssl.session_reused":                        {help: "TLS handshakes that resumed a session"},
	"listener.ssl.connection_error":                      {help: "TLS handshakes that failed or timed out"},
	"listener.ssl.version.tls1_2":                        {help: "TLS handshakes completed with TLS 1.2"},
	"listener.ssl.version.tls1_3":                        {help: "TLS handshakes completed with TLS 1.3"},
	"listener.ssl.alpn.h2":                               {help: "TLS handshakes for which ALPN picked h2"},
	"listener.ssl.alpn.http_1_1":                         {help: "TLS handshakes for which ALPN picked http/1.1"},
	"listener.sni.no_route":                              {help: "TLS passthrough connections closed because no route named their SNI"},
	"listener.ssl.no_certificate":                        {help: "TLS ClientHellos whose SNI named no certificate of the listener (the default one was served)"},
	"listener.ssl.certificate_reload":                    {help: "Certificate/key pairs read again and swapped in"},
	"listener.ssl.certificate_reload_failed":             {help: "Certificate/key pairs read again and refused (the old pair serves on)"},
	"listener.ssl.session_ticket_key_rotation":           {help: "Session-ticket key rotations"},
	"listener.balance.migrated":                          {help: "Queued connections moved by eBPF steering from a closing socket to a live one"},
	"listener.access_log.dropped":                        {help: "Access-log lines dropped because the log's queue was full"},
	"cluster.upstream_cx_total":                          {help: "Connections opened to endpoints"},
	"cluster.upstream_cx_active":                         {help: "Upstream connections open"},
	"cluster.upstream_cx_connect_fail":                   {help: "Connects to endpoints that failed"},
	"cluster.upstream_rq_total":                          {help: "HTTP requests sent to the cluster"},
	"cluster.upstream_rq_time":                           {help: "Time from sending a request to the upstream's response headers", unit: "ms"},
	"cluster.upstream_rq_retry":                          {help: "Retries made by a route's retry_on"},
	"cluster.upstream_rq_retry_success":                  {help: "Retried requests whose last try got a response that was not retried"},
	"cluster.membership_total":                           {help: "Endpoints of the cluster"},
	"cluster.membership_healthy":                         {help: "Endpoints healthy and not ejected (0 in panic mode)"},
	"cluster.health_check.attempt":                       {help: "Active health checks made"},
	"cluster.health_check.success":                       {help: "Active health checks that passed"},
	"cluster.health_check.failure":                       {help: "Active health checks that failed"},
	"cluster.lb_healthy_panic":                           {help: "Requests balanced in panic mode (no endpoint healthy: all used)"},
	"cluster.outlier_detection.ejections_enforced_total": {help: "Endpoints ejected by outlier detection"},
	"cluster.outlier_detection.ejections_overflow":       {help: "Ejections not made: max_ejection_percent reached"},
	"cluster.outlier_detection.ejections_active":         {help: "Endpoints ejected now"},
	"cluster.upstream_rq_pending_overflow":               {help: "Requests answered 503 by a circuit breaker (max_requests, max_pending_requests, max_retries)"},
	"cluster.upstream_cx_overflow":                       {help: "Requests answered 503 because max_connections were open"},
	"cluster.update_attempt":                             {help: "Lookups of endpoint host names (dns_refresh)"},
	"cluster.update_success":                             {help: "Lookups of endpoint host names that succeeded"},
	"cluster.update_failure":                             {help: "Lookups of endpoint host names that failed"},
	"cluster.ssl.handshake":                              {help: "TLS handshakes completed with endpoints"},
	"cluster.ssl.session_reused":                         {help: "TLS handshakes with endpoints that resumed a session"},
	"cluster.ssl.connection_error":                       {help: "TLS handshakes with endpoints that failed or timed out"},
	"worker.downstream_cx_total":                         {help: "Connections accepted by the worker"},
	"stats.overflow":                                     {help: "Stats kept in process memory because the region was full"},
	"stats.region_truncated":                             {help: "Times a generation found the region file truncated and restored it"},
	"stats.region_lost_writes":                           {help: "Counter and gauge updates lost because the region was truncated under them"},
}

// promScopes are the name prefixes whose next component (up to the stat
// that follows) is the name of a listener, cluster or worker, exposed as
// the label of that name.
var promScopes = []string{"listener", "cluster", "worker", "route"}

// promSuffixes[scope] are the known stats of a scope, longest first: a
// listener or cluster name may contain dots, so the name is what is left
// once a known stat is taken off the end.
var promSuffixes = func() map[string][]string {
	m := map[string][]string{}
	for k := range promKnown {
		scope, rest, _ := strings.Cut(k, ".")
		m[scope] = append(m[scope], rest)
	}
	for _, l := range m {
		sort.Slice(l, func(i, j int) bool { return len(l[i]) > len(l[j]) || len(l[i]) == len(l[j]) && l[i] < l[j] })
	}
	return m
}()

// PromLabel is one label pair of a series.
type PromLabel struct{ Name, Value string }

// PromName is how one stat is exposed: its family, its labels (the
// listener, cluster or worker it belongs to), the key of its description
// (promKnown) and, for a time stored in milliseconds, the factor to
// seconds.
type PromName struct {
	Family string
	Labels []PromLabel
	key    string
	scale  float64
}

// PrometheusName maps a stat name to its Prometheus family and labels
// (see the package's Prometheus conventions above). It never fails: a
// name it does not know becomes hotproxy_<sanitised name>.
func PrometheusName(name string, kind shm.Kind) PromName {
	pn := PromName{key: name, scale: 1}
	stat := name
	for _, scope := range promScopes {
		rest, ok := strings.CutPrefix(name, scope+".")
		if !ok || rest == "" {
			continue
		}
		obj, suffix := "", ""
		for _, s := range promSuffixes[scope] {
			if o, ok := strings.CutSuffix(rest, "."+s); ok && o != "" {
				obj, suffix = o, s
				break
			}
		}
		if suffix == "" {
			var found bool
			if obj, suffix, found = strings.Cut(rest, "."); !found || suffix == "" {
				break // "listener.x": no stat after the name; exposed whole
			}
		}
		pn.Labels = []PromLabel{{scope, obj}}
		pn.key = scope + "." + suffix
		stat = scope + "." + suffix
		break
	}
	fam := "hotproxy_" + SanitizeName(stat)
	switch promKnown[pn.key].unit {
	case "ms":
		fam, pn.scale = fam+"_seconds", 1e-3
	case "s":
		if !strings.HasSuffix(fam, "_seconds") {
			fam += "_seconds"
		}
	case "bytes":
		if !strings.HasSuffix(fam, "_bytes") {
			fam += "_bytes"
		}
	}
	if kind == shm.KindCounter && !strings.HasSuffix(fam, "_total") {
		fam += "_total"
	}
	pn.Family = fam
	return pn
}

// help is the # HELP text of a stat's family.
func (pn PromName) help() string {
	if k, ok := promKnown[pn.key]; ok {
		return k.help
	}
	pattern := pn.key
	if len(pn.Labels) > 0 {
		l := pn.Labels[0].Name
		pattern = l + ".<" + l + ">." + strings.TrimPrefix(pn.key, l+".")
	}
	return "hotproxy stat " + pattern
}

// PrometheusOptions selects what WritePrometheusWith writes.
type PrometheusOptions struct {
	ExposeOptions
	// VMRange writes histograms as VictoriaMetrics vmrange buckets (only
	// the non-empty ones, name_bucket{vmrange="lo...hi"}) instead of
	// classic le buckets. Names, labels and units are the same.
	VMRange bool
	// Owners adds the hotproxy_generation_* families (the owner table).
	Owners bool
}

// WritePrometheus writes the snapshot in the Prometheus text format
// (version 0.0.4) with classic histograms and the generation families.
func WritePrometheus(w io.Writer, snap *shm.Snapshot, o ExposeOptions) error {
	return WritePrometheusWith(w, snap, PrometheusOptions{ExposeOptions: o, Owners: true})
}

// WritePrometheusVMRange is WritePrometheus with histograms as
// VictoriaMetrics vmrange buckets.
func WritePrometheusVMRange(w io.Writer, snap *shm.Snapshot, o ExposeOptions) error {
	return WritePrometheusWith(w, snap, PrometheusOptions{ExposeOptions: o, Owners: true, VMRange: true})
}

type promSeries struct {
	labels string // rendered, without braces: a="x",b="y"
	stat   shm.Stat
	scale  float64
}

type promFamily struct {
	name, typ, help string
	series          []promSeries
}

// WritePrometheusWith writes the snapshot in the Prometheus text format:
// families sorted by name, each with # HELP and # TYPE, its series sorted
// by labels. Two stats that map to the same series (names that differ
// only in characters sanitised away) or to one family with two types get
// the family suffix _2, _3, ... so no series is dropped or duplicated.
func WritePrometheusWith(w io.Writer, snap *shm.Snapshot, o PrometheusOptions) error {
	fams := map[string]*promFamily{}
	seen := map[string]bool{} // family + "{" + labels
	for _, st := range o.selected(snap) {
		var typ string
		switch st.Kind {
		case shm.KindCounter:
			typ = "counter"
		case shm.KindGauge:
			typ = "gauge"
		case shm.KindHistogram:
			typ = "histogram"
		default:
			continue // a kind this version does not know
		}
		pn := PrometheusName(st.Name, st.Kind)
		labels := renderLabels(pn.Labels)
		base, name := pn.Family, pn.Family
		for n := 2; ; n++ {
			f := fams[name]
			if !seen[name+"{"+labels] && (f == nil || f.typ == typ) {
				break
			}
			if strings.HasSuffix(base, "_total") {
				name = strings.TrimSuffix(base, "_total") + "_" + strconv.Itoa(n) + "_total"
			} else {
				name = base + "_" + strconv.Itoa(n)
			}
		}
		seen[name+"{"+labels] = true
		f := fams[name]
		if f == nil {
			f = &promFamily{name: name, typ: typ, help: pn.help()}
			fams[name] = f
		}
		f.series = append(f.series, promSeries{labels: labels, stat: st, scale: pn.scale})
	}
	if o.Owners && (o.Filter == nil || o.Filter.MatchString("hotproxy_generation_alive")) {
		addOwnerFamilies(fams, snap.Owners)
	}

	names := make([]string, 0, len(fams))
	for n := range fams {
		names = append(names, n)
	}
	sort.Strings(names)
	bw := bufio.NewWriter(w)
	for _, n := range names {
		f := fams[n]
		sort.SliceStable(f.series, func(i, j int) bool { return f.series[i].labels < f.series[j].labels })
		fmt.Fprintf(bw, "# HELP %s %s\n# TYPE %s %s\n", f.name, escapeHelp(f.help), f.name, f.typ)
		for _, s := range f.series {
			writePromSeries(bw, f.name, s, o.VMRange)
		}
	}
	return bw.Flush()
}

func writePromSeries(bw *bufio.Writer, name string, s promSeries, vmrange bool) {
	st := s.stat
	switch st.Kind {
	case shm.KindCounter:
		fmt.Fprintf(bw, "%s%s %d\n", name, braces(s.labels), st.Counter)
	case shm.KindGauge:
		fmt.Fprintf(bw, "%s%s %d\n", name, braces(s.labels), st.Gauge)
	case shm.KindHistogram:
		h := st.Histogram
		decades := 0
		if s.scale == 1e-3 {
			decades = 3
		}
		var total uint64
		if vmrange {
			for i, c := range h.Buckets {
				if c != 0 {
					lo, hi := BucketBounds(i)
					fmt.Fprintf(bw, "%s_bucket%s %d\n", name, braces(joinLabels(s.labels, `vmrange="`+vmrangeLabel(lo*s.scale, hi*s.scale)+`"`)), c)
				}
				total += c
			}
		} else {
			cum := cumulativeLE(h.Buckets, decades)
			for i, le := range PrometheusBuckets {
				fmt.Fprintf(bw, "%s_bucket%s %d\n", name, braces(joinLabels(s.labels, `le="`+formatFloat(le)+`"`)), cum[i])
			}
			total = cum[len(cum)-1]
			fmt.Fprintf(bw, "%s_bucket%s %d\n", name, braces(joinLabels(s.labels, `le="+Inf"`)), total)
		}
		// The count is the buckets' sum, not the stored count word: the
		// two are added one after the other, and a reader between them
		// would otherwise see +Inf and _count disagree.
		fmt.Fprintf(bw, "%s_sum%s %s\n", name, braces(s.labels), formatFloat(h.Sum*s.scale))
		fmt.Fprintf(bw, "%s_count%s %d\n", name, braces(s.labels), total)
	}
}

// addOwnerFamilies adds the generation families: one series per owner of
// the table, labelled slot, pid and epoch.
func addOwnerFamilies(fams map[string]*promFamily, owners []shm.Owner) {
	alive := &promFamily{name: "hotproxy_generation_alive", typ: "gauge",
		help: "1 while the generation's process runs (it holds its owner lock on the region: the kernel's word), 0 for one that exited or was killed and is not folded yet"}
	start := &promFamily{name: "hotproxy_generation_start_time_seconds", typ: "gauge",
		help: "When the generation started, in seconds since the Unix epoch"}
	beat := &promFamily{name: "hotproxy_generation_heartbeat_time_seconds", typ: "gauge",
		help: "The generation's last heartbeat in the region, in seconds since the Unix epoch"}
	for _, ow := range owners {
		labels := renderLabels([]PromLabel{{"epoch", strconv.FormatUint(ow.Epoch, 10)}, {"pid", strconv.Itoa(ow.PID)}, {"slot", strconv.Itoa(ow.Slot)}})
		v := int64(0)
		if ow.State == shm.OwnerLive {
			v = 1
		}
		alive.series = append(alive.series, promSeries{labels: labels, stat: shm.Stat{Kind: shm.KindGauge, Gauge: v}})
		start.series = append(start.series, promSeries{labels: labels, stat: shm.Stat{Kind: shm.KindGauge, Gauge: max(ow.Start.Unix(), 0)}})
		beat.series = append(beat.series, promSeries{labels: labels, stat: shm.Stat{Kind: shm.KindGauge, Gauge: max(ow.Heartbeat.Unix(), 0)}})
	}
	for _, f := range []*promFamily{alive, start, beat} {
		if _, taken := fams[f.name]; !taken && len(f.series) > 0 {
			fams[f.name] = f
		}
	}
}

func renderLabels(ls []PromLabel) string {
	var b strings.Builder
	for i, l := range ls {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(SanitizeName(l.Name))
		b.WriteString(`="`)
		b.WriteString(escapeLabelValue(l.Value))
		b.WriteByte('"')
	}
	return b.String()
}

func joinLabels(a, b string) string {
	if a == "" {
		return b
	}
	return a + "," + b
}

func braces(labels string) string {
	if labels == "" {
		return ""
	}
	return "{" + labels + "}"
}

// escapeLabelValue escapes a label value for the text format (backslash,
// double quote, newline) and replaces invalid UTF-8: the names come from
// a shared-memory file, whose bytes this process did not write.
func escapeLabelValue(v string) string {
	v = strings.ToValidUTF8(v, "\uFFFD")
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(v)
}

// escapeHelp escapes a help text (backslash and newline).
func escapeHelp(v string) string {
	v = strings.ToValidUTF8(v, "\uFFFD")
	return strings.NewReplacer(`\`, `\\`, "\n", `\n`).Replace(v)
}

// formatFloat writes v as Prometheus does: the shortest representation
// that reads back as v, +Inf/-Inf/NaN spelled its way.
func formatFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// vmrangeLabel is the vmrange label of a bucket with these bounds, as
// metrics.Histogram prints it.
func vmrangeLabel(lo, hi float64) string {
	if math.IsInf(hi, 1) {
		return fmt.Sprintf("%.3e...+Inf", lo)
	}
	if lo == 0 {
		return fmt.Sprintf("0...%.3e", hi)
	}
	return fmt.Sprintf("%.3e...%.3e", lo, hi)
}
