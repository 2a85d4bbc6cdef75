package workers

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/h2c"
	"golang.org/x/net/http2/hpack"

	"github.com/hotproxy/hotproxy/config"
	httpfront "github.com/hotproxy/hotproxy/downstream/http"
	"github.com/hotproxy/hotproxy/h2"
)

// countingBackend is an HTTP/1.1 backend that answers every request with
// size bytes (after reading the request body whole), and counts the
// requests it got and the connections it has open.
type countingBackend struct {
	addr     string
	requests atomic.Int64
	reset    atomic.Int64 // requests for /reset
	open     atomic.Int64
}

func newCountingBackend(tb testing.TB, size int) *countingBackend {
	tb.Helper()
	cb := &countingBackend{}
	body := strings.Repeat("x", size)
	be := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cb.requests.Add(1)
		if r.URL.Path == "/reset" {
			cb.reset.Add(1)
		}
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, body)
	}))
	be.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			cb.open.Add(1)
		case http.StateClosed, http.StateHijacked:
			cb.open.Add(-1)
		}
	}
	be.Start()
	tb.Cleanup(be.Close)
	cb.addr = hostOf(be.URL)
	return cb
}

// writeRequestHeaders writes a request's HEADERS frame on stream.
func writeRequestHeaders(tb testing.TB, fr *http2.Framer, stream uint32, method, authority, path string, endStream bool) {
	tb.Helper()
	var buf strings.Builder
	e := hpack.NewEncoder(&buf)
	for _, f := range [][2]string{{":method", method}, {":scheme", "http"}, {":authority", authority}, {":path", path}} {
		e.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: stream, BlockFragment: []byte(buf.String()), EndStream: endStream, EndHeaders: true}); err != nil {
		tb.Fatal(err)
	}
}

// frameEvents reads rc's frames on a goroutine of its own until the
// connection ends, answering the server's SETTINGS, and reports what
// matters to a flood test.
type frameEvents struct {
	goAway   chan *http2.GoAwayFrame // the first GOAWAY (copied)
	pingAcks chan [8]byte
	resets   chan uint32
	ended    chan error // the read error that ended the connection
	// replies counts the server's SETTINGS and PING acks: what it
	// answered of a flood, whatever the kernel buffered of the rest.
	replies atomic.Int64
}

func readFrameEvents(rc *rawH2Conn, wmu *sync.Mutex) *frameEvents {
	ev := &frameEvents{
		goAway:   make(chan *http2.GoAwayFrame, 1),
		pingAcks: make(chan [8]byte, 1024),
		resets:   make(chan uint32, 1<<16),
		ended:    make(chan error, 1),
	}
	go func() {
		sawGoAway := false
		for {
			f, err := rc.fr.ReadFrame()
			if err != nil {
				ev.ended <- err
				return
			}
			switch f := f.(type) {
			case *http2.GoAwayFrame:
				if !sawGoAway {
					sawGoAway = true
					ev.goAway <- &http2.GoAwayFrame{LastStreamID: f.LastStreamID, ErrCode: f.ErrCode}
				}
			case *http2.PingFrame:
				if f.IsAck() {
					ev.replies.Add(1)
					select {
					case ev.pingAcks <- f.Data:
					default:
					}
				}
			case *http2.RSTStreamFrame:
				select {
				case ev.resets <- f.StreamID:
				default:
				}
			case *http2.SettingsFrame:
				if f.IsAck() {
					ev.replies.Add(1)
				} else {
					wmu.Lock()
					rc.fr.WriteSettingsAck()
					wmu.Unlock()
				}
			}
		}
	}()
	return ev
}

// expectCalm waits for a GOAWAY ENHANCE_YOUR_CALM and the connection's
// end, within bound of start.
func (ev *frameEvents) expectCalm(t *testing.T, start time.Time, bound time.Duration) {
	t.Helper()
	deadline := time.NewTimer(time.Until(start.Add(bound)))
	defer deadline.Stop()
	var endErr error
	select {
	case endErr = <-ev.ended:
	case <-deadline.C:
	}
	// The reader reports the GOAWAY before the connection's end.
	select {
	case ga := <-ev.goAway:
		if ga.ErrCode != http2.ErrCodeEnhanceYourCalm {
			t.Fatalf("GOAWAY %v, want ENHANCE_YOUR_CALM", ga.ErrCode)
		}
	default:
		if endErr != nil {
			t.Fatalf("the connection ended after %v without a GOAWAY: %v", time.Since(start).Round(time.Millisecond), endErr)
		}
		t.Fatalf("no GOAWAY within %v of the flood's start", bound)
	}
	if endErr == nil {
		t.Fatalf("the connection still open %v after the flood's start (GOAWAY sent)", bound)
	}
}

// TestH2CZeroWindowStreamReset: a client that advertises
// SETTINGS_INITIAL_WINDOW_SIZE = 0 and never opens a window gets each
// stream reset within about write_timeout, and the upstream connections
// those streams held are closed (issue 20 item 3).
func TestH2CZeroWindowStreamReset(t *testing.T) {
	be := newCountingBackend(t, 256<<10)
	const writeTimeout = time.Second
	m := startManager(t, proxyConfig(be.addr, h2cListener, func(l *config.Listener) { l.WriteTimeout = dur(writeTimeout) }), 1)
	a := addr(t, m, "web")
	rc := dialRawH2(t, a)
	if err := rc.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0}); err != nil {
		t.Fatal(err)
	}
	const streams = 8
	for i := range streams {
		rc.get(t, uint32(2*i+1), a, "/big")
	}
	start := time.Now()
	waitFor(t, 10*time.Second, "every stream's upstream request", func() bool { return be.requests.Load() == streams })
	var wmu sync.Mutex
	ev := readFrameEvents(rc, &wmu)
	reset := map[uint32]bool{}
	bound := time.NewTimer(4*writeTimeout + 4*time.Second)
	defer bound.Stop()
	for len(reset) < streams {
		select {
		case id := <-ev.resets:
			reset[id] = true
		case err := <-ev.ended:
			t.Fatalf("connection ended with %d of %d streams reset: %v", len(reset), streams, err)
		case <-bound.C:
			t.Fatalf("%d of %d streams reset %v after their requests (write_timeout %v): a closed window pins them", len(reset), streams, time.Since(start).Round(time.Millisecond), writeTimeout)
		}
	}
	if d := time.Since(start); d < writeTimeout/2 {
		t.Errorf("streams reset %v after their requests, before write_timeout (%v)", d, writeTimeout)
	}
	waitFor(t, 10*time.Second, "the backend's connections closed", func() bool { return be.open.Load() == 0 })
	// The connection itself is still usable.
	if err := rc.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20}); err != nil {
		t.Fatal(err)
	}
}

// TestH2CRapidResetFlood: a client that opens streams and resets them at
// once gets a GOAWAY ENHANCE_YOUR_CALM and is closed, the backend sees far
// fewer requests than the resets, and another client is served all along
// (issue 20 item 6).
func TestH2CRapidResetFlood(t *testing.T) {
	be := newCountingBackend(t, 16)
	m := startManager(t, proxyConfig(be.addr, h2cListener), 1)
	a := addr(t, m, "web")

	// The well-behaved client, on a connection of its own.
	good := h2cClient(t)
	stopGood := make(chan struct{})
	var goodOK, goodFailed atomic.Int64
	var goodErr atomic.Value
	var goodWG sync.WaitGroup
	goodWG.Add(1)
	go func() {
		defer goodWG.Done()
		for i := 0; i < 100000; i++ {
			select {
			case <-stopGood:
				return
			default:
			}
			resp, err := good.Get("http://" + a + "/good")
			if err == nil {
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err == nil && resp.StatusCode != 200 {
					err = errors.New(resp.Status)
				}
			}
			if err != nil {
				goodFailed.Add(1)
				goodErr.Store(err)
				continue
			}
			goodOK.Add(1)
		}
	}()
	waitFor(t, 10*time.Second, "the good client served", func() bool { return goodOK.Load() > 0 })

	rc := dialRawH2(t, a)
	var wmu sync.Mutex
	ev := readFrameEvents(rc, &wmu)
	bw := bufio.NewWriterSize(rc.c, 64<<10)
	fr := http2.NewFramer(bw, nil)
	const pairs, batch = 4000, 25
	start := time.Now()
	sent := 0
	calm := false
flood:
	for sent < pairs {
		wmu.Lock()
		for range batch {
			id := uint32(2*sent + 1)
			writeRequestHeaders(t, fr, id, "GET", a, "/reset", true)
			fr.WriteRSTStream(id, http2.ErrCodeCancel)
			sent++
		}
		// A PING round trip per batch: the server has read the batch
		// before the next one goes (a flood paced to the server, as
		// the attack that found this was).
		fr.WritePing(false, [8]byte{byte(sent >> 8), byte(sent)})
		err := bw.Flush()
		wmu.Unlock()
		if err != nil {
			break // the server closed the connection
		}
		select {
		case <-ev.pingAcks:
		case ga := <-ev.goAway:
			ev.goAway <- ga
			calm = true
			break flood
		case err := <-ev.ended:
			ev.ended <- err
			break flood
		case <-time.After(10 * time.Second):
			t.Fatalf("no PING ACK after %d resets", sent)
		}
	}
	t.Logf("%d streams opened and reset in %v; GOAWAY before the end: %v; the backend got %d of them so far",
		sent, time.Since(start).Round(time.Millisecond), calm, be.reset.Load())
	ev.expectCalm(t, start, 20*time.Second)
	close(stopGood)
	goodWG.Wait()

	if n := be.reset.Load(); n*4 > int64(sent) {
		t.Errorf("the backend got %d requests for %d streams reset at once (want far fewer)", n, sent)
	} else {
		t.Logf("the backend got %d requests for %d reset streams", n, sent)
	}
	if n := goodFailed.Load(); n > 0 {
		t.Errorf("the well-behaved client had %d failed requests (%d ok) during the flood: %v", n, goodOK.Load(), goodErr.Load())
	}
	if _, body := h2Do(t, good, newReq(t, "GET", "http://"+a+"/after", nil)); len(body) != 16 {
		t.Errorf("after the flood: body %q", body)
	}
	if n := lstat(m, httpfront.StatH2Calm); n != 1 {
		t.Errorf("%s = %d, want 1", httpfront.StatH2Calm, n)
	}
}

// TestH2CControlFrameFloods: a connection that floods frames carrying no
// request gets a GOAWAY ENHANCE_YOUR_CALM and is closed, bounded in time
// (issue 20 item 7).
func TestH2CControlFrameFloods(t *testing.T) {
	be := newCountingBackend(t, 16)
	m := startManager(t, proxyConfig(be.addr, h2cListener), 1)
	a := addr(t, m, "web")
	floods := []struct {
		name  string
		open  bool // a stream with a request body is opened first
		reply bool // the server acks each one it takes
		send  func(fr *http2.Framer, i int) error
	}{
		{"SETTINGS", false, true, func(fr *http2.Framer, i int) error {
			return fr.WriteSettings(http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: 100})
		}},
		{"PING", false, true, func(fr *http2.Framer, i int) error { return fr.WritePing(false, [8]byte{byte(i)}) }},
		{"WINDOW_UPDATE", false, false, func(fr *http2.Framer, i int) error { return fr.WriteWindowUpdate(0, 1) }},
		{"PRIORITY", false, false, func(fr *http2.Framer, i int) error {
			return fr.WritePriority(uint32(2*i+1), http2.PriorityParam{StreamDep: 0, Weight: 15})
		}},
		{"unknown type", false, false, func(fr *http2.Framer, i int) error { return fr.WriteRawFrame(0xfa, 0, 0, nil) }},
		{"empty DATA", true, false, func(fr *http2.Framer, i int) error { return fr.WriteData(1, false, nil) }},
	}
	for _, fl := range floods {
		t.Run(strings.ReplaceAll(fl.name, " ", "_"), func(t *testing.T) {
			rc := dialRawH2(t, a)
			var wmu sync.Mutex
			ev := readFrameEvents(rc, &wmu)
			bw := bufio.NewWriterSize(rc.c, 64<<10)
			fr := http2.NewFramer(bw, nil)
			if fl.open {
				wmu.Lock()
				writeRequestHeaders(t, fr, 1, "POST", a, "/upload", false)
				bw.Flush()
				wmu.Unlock()
				waitFor(t, 10*time.Second, "the upload at the backend", func() bool { return be.requests.Load() > 0 })
			}
			start := time.Now()
			const frames = 200000
			sent := 0
		flood:
			for sent < frames {
				wmu.Lock()
				for range 256 {
					fl.send(fr, sent)
					sent++
				}
				err := bw.Flush()
				wmu.Unlock()
				if err != nil {
					break
				}
				select {
				case ga := <-ev.goAway:
					ev.goAway <- ga
					break flood
				case err := <-ev.ended:
					ev.ended <- err
					break flood
				default:
				}
			}
			t.Logf("%d %s frames sent in %v", sent, fl.name, time.Since(start).Round(time.Millisecond))
			ev.expectCalm(t, start, 15*time.Second)
			// Judged by what the server answered, not by what the client
			// got to write: loopback can buffer all 200,000 frames (3 MB)
			// before the GOAWAY, on a busy machine. Every reply past the
			// budget (h2.ControlFrameBurst, then h2.ControlFramesPerSecond)
			// would be a frame the server should have refused.
			if fl.reply {
				bound := int64(h2.ControlFrameBurst) + int64(h2.ControlFramesPerSecond*time.Since(start).Seconds()) + 1
				if got := ev.replies.Load(); got > bound {
					t.Errorf("the server answered %d %s frames, past its budget of %d", got, fl.name, bound)
				}
			}
		})
	}
}

// TestH2CDrainGracefulGoAway: a drain's GOAWAY is RFC 9113 §6.8's graceful
// one: first a GOAWAY with stream id 2^31-1 and a PING; a request the
// client sends before it answers the PING is served; then the final
// GOAWAY carries the real last stream id (issue 20 item 9).
func TestH2CDrainGracefulGoAway(t *testing.T) {
	cfg := directConfig("ok")
	h2cListener(&cfg.Listeners[0])
	m := startManager(t, cfg, 1)
	a := addr(t, m, "web")
	rc := dialRawH2(t, a)
	rc.c.SetDeadline(time.Now().Add(15 * time.Second))
	rc.get(t, 1, a, "/before")
	statuses := map[uint32]string{}
	readUntil := func(what string, done func(f http2.Frame) bool) {
		t.Helper()
		for {
			f, err := rc.fr.ReadFrame()
			if err != nil {
				t.Fatalf("waiting for %s: %v", what, err)
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					rc.fr.WriteSettingsAck()
				}
			case *http2.MetaHeadersFrame:
				statuses[f.StreamID] = f.PseudoValue("status")
			}
			if done(f) {
				return
			}
		}
	}
	readUntil("the first response", func(f http2.Frame) bool { return statuses[1] != "" && f.Header().Flags.Has(http2.FlagDataEndStream) })

	drained := make(chan error, 1)
	go func() { drained <- m.Drain(ctxTimeout(t, 20*time.Second), DrainOptions{HTTPTimeout: 15 * time.Second}) }()

	var first *http2.GoAwayFrame
	var ping [8]byte
	readUntil("the first GOAWAY and its PING", func(f http2.Frame) bool {
		switch f := f.(type) {
		case *http2.GoAwayFrame:
			if first != nil {
				t.Fatalf("a second GOAWAY (last stream %d) before the PING", f.LastStreamID)
			}
			first = &http2.GoAwayFrame{LastStreamID: f.LastStreamID, ErrCode: f.ErrCode}
			if f.ErrCode != http2.ErrCodeNo || f.LastStreamID != 1<<31-1 {
				t.Fatalf("first GOAWAY: last stream %d, %v; want 2^31-1, NO_ERROR (RFC 9113 §6.8)", f.LastStreamID, f.ErrCode)
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				if first == nil {
					t.Fatal("a PING before the first GOAWAY")
				}
				ping = f.Data
				return true
			}
		}
		return false
	})
	// A request in flight when the client learns of the drain: sent
	// before the PING's ACK, so the final GOAWAY must cover it.
	rc.get(t, 3, a, "/between")
	if err := rc.fr.WritePing(true, ping); err != nil {
		t.Fatal(err)
	}
	var final *http2.GoAwayFrame
	readUntil("the final GOAWAY and the response to the request sent between", func(f http2.Frame) bool {
		if ga, ok := f.(*http2.GoAwayFrame); ok {
			final = &http2.GoAwayFrame{LastStreamID: ga.LastStreamID, ErrCode: ga.ErrCode}
		}
		return final != nil && statuses[3] != ""
	})
	if final.ErrCode != http2.ErrCodeNo || final.LastStreamID != 3 {
		t.Errorf("final GOAWAY: last stream %d, %v; want 3, NO_ERROR", final.LastStreamID, final.ErrCode)
	}
	if statuses[3] != "200" {
		t.Errorf("request sent between the GOAWAYs: status %q, want 200", statuses[3])
	}
	for {
		if _, err := rc.fr.ReadFrame(); err != nil {
			break
		}
	}
	select {
	case err := <-drained:
		if err != nil {
			t.Fatalf("drain: %v (want it to finish by itself)", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("drain did not end")
	}
}

// TestH2CDrainFinalGoAwayPerConnection: the final GOAWAY of the graceful
// drain is each connection's own: a connection whose client has not
// answered the PING yet keeps serving what it sends (here: a request sent
// after another connection's PING was answered) and gets its final GOAWAY
// only at its own ACK.
func TestH2CDrainFinalGoAwayPerConnection(t *testing.T) {
	cfg := directConfig("ok")
	h2cListener(&cfg.Listeners[0])
	m := startManager(t, cfg, 1)
	a := addr(t, m, "web")
	type conn struct {
		rc       *rawH2Conn
		statuses map[uint32]string
	}
	open := func() *conn {
		c := &conn{rc: dialRawH2(t, a), statuses: map[uint32]string{}}
		c.rc.c.SetDeadline(time.Now().Add(15 * time.Second))
		c.rc.get(t, 1, a, "/before")
		return c
	}
	// readUntil reads c's frames until done says so; a GOAWAY is
	// returned as a copy.
	readUntil := func(c *conn, what string, done func(f http2.Frame) bool) {
		t.Helper()
		for {
			f, err := c.rc.fr.ReadFrame()
			if err != nil {
				t.Fatalf("waiting for %s: %v", what, err)
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					c.rc.fr.WriteSettingsAck()
				}
			case *http2.MetaHeadersFrame:
				c.statuses[f.StreamID] = f.PseudoValue("status")
			}
			if done(f) {
				return
			}
		}
	}
	quick, slow := open(), open()
	for _, c := range []*conn{quick, slow} {
		readUntil(c, "the first response", func(http2.Frame) bool { return c.statuses[1] == "200" })
	}
	go m.Drain(ctxTimeout(t, 20*time.Second), DrainOptions{HTTPTimeout: 15 * time.Second})

	pings := map[*conn][8]byte{}
	for _, c := range []*conn{quick, slow} {
		var first *http2.GoAwayFrame
		readUntil(c, "the first GOAWAY and its PING", func(f http2.Frame) bool {
			switch f := f.(type) {
			case *http2.GoAwayFrame:
				first = &http2.GoAwayFrame{LastStreamID: f.LastStreamID}
			case *http2.PingFrame:
				if !f.IsAck() {
					pings[c] = f.Data
					return true
				}
			}
			return false
		})
		if first == nil || first.LastStreamID != 1<<31-1 {
			t.Fatalf("first GOAWAY %v, want one with stream id 2^31-1 before the PING", first)
		}
	}
	// The quick client answers: its final GOAWAY comes.
	quick.rc.fr.WritePing(true, pings[quick])
	readUntil(quick, "the quick connection's final GOAWAY", func(f http2.Frame) bool {
		ga, ok := f.(*http2.GoAwayFrame)
		if ok && ga.LastStreamID != 1 {
			t.Errorf("quick connection's final GOAWAY: last stream %d, want 1", ga.LastStreamID)
		}
		return ok
	})
	// The slow client, which has not answered yet, sends a request: it
	// is still in flight as far as the drain knows, and is served.
	slow.rc.get(t, 3, a, "/late")
	slow.rc.fr.WritePing(true, pings[slow])
	var final *http2.GoAwayFrame
	readUntil(slow, "the slow connection's response and final GOAWAY", func(f http2.Frame) bool {
		if ga, ok := f.(*http2.GoAwayFrame); ok {
			final = &http2.GoAwayFrame{LastStreamID: ga.LastStreamID}
		}
		return final != nil && slow.statuses[3] != ""
	})
	if final.LastStreamID != 3 || slow.statuses[3] != "200" {
		t.Errorf("slow connection: final GOAWAY last stream %d, request sent before its ACK answered %q; want 3 and 200", final.LastStreamID, slow.statuses[3])
	}
}

// TestH2CZeroWindowToH2Upstream: as TestH2CZeroWindowStreamReset, with a
// cluster spoken to in HTTP/2: the streams are reset at write_timeout and
// their upstream streams cancelled (the backend's handlers end).
func TestH2CZeroWindowToH2Upstream(t *testing.T) {
	var started, ended atomic.Int64
	body := strings.Repeat("y", 256<<10)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started.Add(1)
		defer ended.Add(1)
		for i := 0; i < len(body); i += 16 << 10 {
			if _, err := io.WriteString(w, body[i:i+16<<10]); err != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
	})
	be := httptest.NewServer(h2c.NewHandler(h, &http2.Server{}))
	t.Cleanup(be.Close)
	const writeTimeout = time.Second
	cfg := proxyConfig(hostOf(be.URL), h2cListener, func(l *config.Listener) { l.WriteTimeout = dur(writeTimeout) })
	cfg.Clusters[0].HTTP2 = true
	m := startManager(t, cfg, 1)
	a := addr(t, m, "web")
	rc := dialRawH2(t, a)
	if err := rc.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0}); err != nil {
		t.Fatal(err)
	}
	const streams = 4
	for i := range streams {
		rc.get(t, uint32(2*i+1), a, "/big")
	}
	waitFor(t, 10*time.Second, "every stream's upstream request", func() bool { return started.Load() == streams })
	var wmu sync.Mutex
	ev := readFrameEvents(rc, &wmu)
	reset := map[uint32]bool{}
	bound := time.NewTimer(4*writeTimeout + 4*time.Second)
	defer bound.Stop()
	for len(reset) < streams {
		select {
		case id := <-ev.resets:
			reset[id] = true
		case err := <-ev.ended:
			t.Fatalf("connection ended with %d of %d streams reset: %v", len(reset), streams, err)
		case <-bound.C:
			t.Fatalf("%d of %d streams reset (write_timeout %v): a closed window pins them", len(reset), streams, writeTimeout)
		}
	}
	waitFor(t, 10*time.Second, "the upstream streams cancelled", func() bool { return ended.Load() == streams })
}
