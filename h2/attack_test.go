package h2

import (
	"bufio"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// wellBehaved runs a client on its own connection that keeps getting
// answers while an attack runs; stop returns how many it got and whether
// any failed.
func wellBehaved(t *testing.T, addr string) (stop func() (served int, failure error)) {
	rc := dialRaw(t, addr)
	done := make(chan struct{})
	var served atomic.Int64
	var failure error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for id := uint32(1); id < 20000; id += 2 {
			status, body, err := rc.get(id, "/good", 10*time.Second)
			if err != nil || status != "200" || string(body) != "hello, h2\n" {
				failure = &wellBehavedError{status, err}
				return
			}
			served.Add(1)
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	return func() (int, error) {
		close(done)
		wg.Wait()
		return int(served.Load()), failure
	}
}

type wellBehavedError struct {
	status string
	err    error
}

func (e *wellBehavedError) Error() string {
	return "well-behaved client: status " + e.status + ", error " + errString(e.err)
}

func errString(err error) string {
	if err == nil {
		return "none"
	}
	return err.Error()
}

func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// floodTest runs attack against a fresh listener next to a well-behaved
// client and checks the attacker's connection ends with GOAWAY want, the
// other client was served throughout, and the heap stayed bounded.
func floodTest(t *testing.T, cfg *ServerConfig, wantCode http2.ErrCode, wantFlood string, attack func(rc *rawClient, bw *bufio.Writer, fr *http2.Framer)) {
	t.Helper()
	var floods sync.Map
	cfg.Events.FloodDetected = func(kind string) { floods.Store(kind, true) }
	ts := startServer(t, cfg, answerHandler, nil)
	stop := wellBehaved(t, ts.addr())
	before := heapInUse()

	rc := dialRaw(t, ts.addr())
	bw := bufio.NewWriterSize(rc.c, 64<<10)
	fr := http2.NewFramer(bw, nil)
	attack(rc, bw, fr)
	bw.Flush()
	res := rc.awaitGoAway(20 * time.Second)

	served, failure := stop()
	after := heapInUse()
	if !res.sawGoAway || res.code != wantCode {
		t.Errorf("attacker's connection: GOAWAY seen %v code %v, want GOAWAY %v", res.sawGoAway, res.code, wantCode)
	}
	if !res.closed {
		t.Errorf("attacker's connection still open 20s after the attack")
	}
	if wantFlood != "" {
		if _, ok := floods.Load(wantFlood); !ok {
			t.Errorf("Events.FloodDetected(%q) not called", wantFlood)
		}
	}
	if failure != nil || served == 0 {
		t.Errorf("well-behaved client: %d served, failure %v", served, failure)
	}
	const bound = 64 << 20
	if after > before+bound {
		t.Errorf("heap grew from %d to %d bytes during the attack (bound %d)", before, after, bound)
	}
	t.Logf("well-behaved client served %d; heap %d -> %d", served, before, after)
}

// writeOrStop reports whether the attack should continue: a write error
// means the server already closed the connection.
func writeOrStop(err error) bool { return err == nil }

func TestRapidResetGoAway(t *testing.T) {
	cfg := &ServerConfig{ResetBurst: 200, ResetPerSecond: 10}
	floodTest(t, cfg, http2.ErrCodeEnhanceYourCalm, "reset", func(rc *rawClient, bw *bufio.Writer, fr *http2.Framer) {
		block := rc.block("GET", "/")
		for id := uint32(1); id < 200000; id += 2 {
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndStream: true, EndHeaders: true})
			fr.WriteRSTStream(id, http2.ErrCodeCancel)
			if id%200 == 1 && !writeOrStop(bw.Flush()) {
				return
			}
		}
	})
}

// A reset stream counts against MaxConcurrentStreams until its handler
// returns: with handlers held, the stream past the limit is refused even
// though the client reset all the earlier ones.
func TestRapidResetCountsUntilHandlerReturns(t *testing.T) {
	release := make(chan struct{})
	var started atomic.Int64
	h := HandlerFunc(func(st *Stream) {
		started.Add(1)
		<-release
	})
	const limit = 8
	ts := startServer(t, &ServerConfig{MaxConcurrentStreams: limit}, h, nil)
	defer close(release)
	rc := dialRaw(t, ts.addr())
	block := rc.block("GET", "/")
	for i := uint32(0); i < limit; i++ {
		rc.headers(2*i+1, block, true)
		rc.fr.WriteRSTStream(2*i+1, http2.ErrCodeCancel)
	}
	over := uint32(2*limit + 1)
	rc.headers(over, block, true)
	rc.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		f, err := rc.fr.ReadFrame()
		if err != nil {
			t.Fatalf("no RST_STREAM for stream %d over the limit: %v", over, err)
		}
		if r, ok := f.(*http2.RSTStreamFrame); ok && r.StreamID == over {
			if r.ErrCode != http2.ErrCodeRefusedStream {
				t.Fatalf("stream %d over the limit reset with %v, want REFUSED_STREAM", over, r.ErrCode)
			}
			break
		}
	}
	if n := started.Load(); n > limit {
		t.Errorf("%d handlers started, more than MaxConcurrentStreams %d", n, limit)
	}
}

func TestContinuationFloodGoAway(t *testing.T) {
	cfg := &ServerConfig{MaxHeaderListSize: 16 << 10}
	floodTest(t, cfg, http2.ErrCodeProtocol, "header-block", func(rc *rawClient, bw *bufio.Writer, fr *http2.Framer) {
		// 0x82 is the indexed field ":method: GET": valid HPACK, so only
		// the size bound can stop it.
		frag := make([]byte, 16<<10)
		for i := range frag {
			frag[i] = 0x82
		}
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: frag[:100]})
		for i := 0; i < 100000; i++ {
			fr.WriteContinuation(1, false, frag)
			if !writeOrStop(bw.Flush()) {
				return
			}
		}
	})
}

func TestEmptyContinuationFloodGoAway(t *testing.T) {
	cfg := &ServerConfig{ResetBurst: 10, ResetPerSecond: 1}
	floodTest(t, cfg, http2.ErrCodeEnhanceYourCalm, "empty-frames", func(rc *rawClient, bw *bufio.Writer, fr *http2.Framer) {
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: rc.block("GET", "/")[:1]})
		for i := 0; i < 1000000; i++ {
			fr.WriteContinuation(1, false, nil)
			if i%1000 == 0 && !writeOrStop(bw.Flush()) {
				return
			}
		}
	})
}

func TestEmptyDataFloodGoAway(t *testing.T) {
	cfg := &ServerConfig{ResetBurst: 10, ResetPerSecond: 1}
	floodTest(t, cfg, http2.ErrCodeEnhanceYourCalm, "empty-frames", func(rc *rawClient, bw *bufio.Writer, fr *http2.Framer) {
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: rc.block("POST", "/"), EndHeaders: true})
		for i := 0; i < 1000000; i++ {
			fr.WriteData(1, false, nil)
			if i%1000 == 0 && !writeOrStop(bw.Flush()) {
				return
			}
		}
	})
}

// appendHpackInt encodes an HPACK integer with an n-bit prefix (RFC 7541 §5.1).
func appendHpackInt(dst []byte, first byte, n uint, v uint64) []byte {
	max := uint64(1)<<n - 1
	if v < max {
		return append(dst, first|byte(v))
	}
	dst = append(dst, first|byte(max))
	v -= max
	for v >= 128 {
		dst = append(dst, byte(v%128+128))
		v /= 128
	}
	return append(dst, byte(v))
}

func TestHPACKTableSizeBombGoAway(t *testing.T) {
	floodTest(t, &ServerConfig{}, http2.ErrCodeCompression, "", func(rc *rawClient, bw *bufio.Writer, fr *http2.Framer) {
		// A dynamic table size update to 1 MiB, past our 4096.
		block := appendHpackInt(nil, 0x20, 5, 1<<20)
		block = append(block, rc.block("GET", "/")...)
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block, EndStream: true, EndHeaders: true})
	})
}

// A header list that decodes far past MaxHeaderListSize from a few bytes
// (one big dynamic-table entry referenced again and again) gets 431 and
// the connection stays usable.
func TestHPACKListBomb431(t *testing.T) {
	ts := startServer(t, &ServerConfig{MaxHeaderListSize: 16 << 10}, answerHandler, nil)
	before := heapInUse()
	rc := dialRaw(t, ts.addr())
	big := make([]byte, 3000)
	for i := range big {
		big[i] = 'x'
	}
	// Our encoder indexes the big field once; later blocks reference it.
	head := rc.block("GET", "/bomb")
	rc.buf.Reset()
	rc.enc.WriteField(hpack.HeaderField{Name: "x-bomb", Value: string(big)})
	insert := append([]byte(nil), rc.buf.Bytes()...)
	rc.buf.Reset()
	rc.enc.WriteField(hpack.HeaderField{Name: "x-bomb", Value: string(big)})
	ref := append([]byte(nil), rc.buf.Bytes()...)
	if len(ref) != 1 {
		t.Fatalf("setup: the repeated field encoded to %d bytes, want an index of 1", len(ref))
	}
	block := append(head, insert...)
	for i := 0; i < 2000; i++ {
		block = append(block, ref...) // 2000 x 3 KB decoded from 2 KB
	}
	rc.headers(1, block, true)
	rc.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	status := ""
	for status == "" {
		f, err := rc.fr.ReadFrame()
		if err != nil {
			t.Fatalf("no response to the bomb: %v", err)
		}
		if h, ok := f.(*http2.HeadersFrame); ok && h.StreamID == 1 {
			rc.dec().Write(h.HeaderBlockFragment())
			status = rc.lastStatus
		}
		if g, ok := f.(*http2.GoAwayFrame); ok {
			t.Fatalf("GOAWAY %v, want a 431 on the stream", g.ErrCode)
		}
	}
	if status != "431" {
		t.Errorf("bomb answered %s, want 431", status)
	}
	if st, body, err := rc.get(3, "/after", 10*time.Second); err != nil || st != "200" || string(body) != "hello, h2\n" {
		t.Errorf("request after the bomb: %s %q %v", st, body, err)
	}
	if after := heapInUse(); after > before+64<<20 {
		t.Errorf("heap grew from %d to %d", before, after)
	}
}

// Control-frame reply floods from a client that does not read: the
// server's socket buffer is made tiny so replies back up at once.
func controlFloodTest(t *testing.T, frame func(fr *http2.Framer, i int)) {
	// The budget of frames that carry no request is out of reach here:
	// this is the bound on replies left unread, which must trip by
	// itself (the budget has its own test).
	cfg := &ServerConfig{MaxQueuedControlFrames: 500, ResetBurst: 1 << 30, ResetPerSecond: 1 << 30,
		ControlFrameBurst: 1 << 30, ControlFramesPerSecond: 1 << 30}
	floodTest(t, cfg, http2.ErrCodeEnhanceYourCalm, "control", func(rc *rawClient, bw *bufio.Writer, fr *http2.Framer) {
		for i := 0; i < 2000000; i++ {
			frame(fr, i)
			if i%500 == 0 && !writeOrStop(bw.Flush()) {
				return
			}
		}
	})
}

func TestPingFloodGoAway(t *testing.T) {
	controlFloodTest(t, func(fr *http2.Framer, i int) { fr.WritePing(false, [8]byte{byte(i)}) })
}

func TestSettingsFloodGoAway(t *testing.T) {
	controlFloodTest(t, func(fr *http2.Framer, i int) { fr.WriteSettings() })
}

func TestResetReplyFloodGoAway(t *testing.T) {
	// PRIORITY naming itself on a new stream each time: the server must
	// answer each with RST_STREAM PROTOCOL_ERROR.
	controlFloodTest(t, func(fr *http2.Framer, i int) {
		id := uint32(2*i + 1)
		fr.WritePriority(id, http2.PriorityParam{StreamDep: id, Weight: 1})
	})
}

func TestWindowUpdateOverflowGoAway(t *testing.T) {
	floodTest(t, &ServerConfig{}, http2.ErrCodeFlowControl, "", func(rc *rawClient, bw *bufio.Writer, fr *http2.Framer) {
		fr.WriteWindowUpdate(0, maxWindow)
		fr.WriteWindowUpdate(0, maxWindow)
	})
}

func TestWindowUpdateOverflowStreamReset(t *testing.T) {
	release := make(chan struct{})
	h := HandlerFunc(func(st *Stream) { <-release })
	ts := startServer(t, &ServerConfig{}, h, nil)
	defer close(release)
	rc := dialRaw(t, ts.addr())
	rc.headers(1, rc.block("GET", "/"), true)
	rc.fr.WriteWindowUpdate(1, maxWindow)
	rc.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		f, err := rc.fr.ReadFrame()
		if err != nil {
			t.Fatalf("no RST_STREAM: %v", err)
		}
		if r, ok := f.(*http2.RSTStreamFrame); ok {
			if r.StreamID != 1 || r.ErrCode != http2.ErrCodeFlowControl {
				t.Fatalf("RST_STREAM %d %v, want 1 FLOW_CONTROL_ERROR", r.StreamID, r.ErrCode)
			}
			return
		}
	}
}

func TestStreamIDExhaustion(t *testing.T) {
	ts := startServer(t, &ServerConfig{}, answerHandler, nil)
	rc := dialRaw(t, ts.addr())
	status, body, err := rc.get(maxWindow, "/last", 10*time.Second)
	if err != nil || status != "200" || string(body) != "hello, h2\n" {
		t.Fatalf("stream 2^31-1: %s %q %v", status, body, err)
	}
	res := rc.awaitGoAway(10 * time.Second)
	if rc.goAway != nil { // it came before the response ended
		res.sawGoAway, res.code, res.lastID = true, rc.goAway.ErrCode, rc.goAway.LastStreamID
	}
	if !res.sawGoAway || res.code != http2.ErrCodeNo || res.lastID != maxWindow || !res.closed {
		t.Errorf("after the last stream id: %+v, want GOAWAY NO_ERROR last %d and close", res, uint32(maxWindow))
	}
}

// A client whose window stays closed: the stream is reset after
// WriteStallTimeout, the handler's Write fails, nothing piles up.
func TestWriteStallResetsStream(t *testing.T) {
	writeErr := make(chan error, 1)
	h := HandlerFunc(func(st *Stream) {
		st.WriteHeaders(200, nil, false)
		chunk := make([]byte, 64<<10)
		for i := 0; i < 1000; i++ {
			if _, err := st.Write(chunk); err != nil {
				writeErr <- err
				return
			}
		}
		writeErr <- nil
	})
	ts := startServer(t, &ServerConfig{WriteStallTimeout: 500 * time.Millisecond}, h, nil)
	rc := dialRaw(t, ts.addr())
	rc.headers(1, rc.block("GET", "/big"), true)
	rc.c.SetReadDeadline(time.Now().Add(15 * time.Second))
	got := 0
	for {
		f, err := rc.fr.ReadFrame()
		if err != nil {
			t.Fatalf("no RST_STREAM after %d bytes: %v", got, err)
		}
		if d, ok := f.(*http2.DataFrame); ok {
			got += len(d.Data())
		}
		if r, ok := f.(*http2.RSTStreamFrame); ok {
			if r.ErrCode != http2.ErrCodeCancel {
				t.Errorf("stalled stream reset with %v, want CANCEL", r.ErrCode)
			}
			break
		}
	}
	if got > 65535 {
		t.Errorf("server sent %d bytes past the 65535-byte window", got)
	}
	select {
	case err := <-writeErr:
		if err != ErrStreamStalled {
			t.Errorf("handler's Write: %v, want ErrStreamStalled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("handler's Write did not return after the reset")
	}
}

// A client that opens its windows wide and then never reads the socket:
// the write deadline closes the connection, memory stays bounded.
func TestClientNeverReads(t *testing.T) {
	writeErr := make(chan error, 1)
	h := HandlerFunc(func(st *Stream) {
		if st.Path() != "/big" {
			answerHandler(st)
			return
		}
		st.WriteHeaders(200, nil, false)
		chunk := make([]byte, 64<<10)
		for i := 0; i < 100000; i++ {
			if _, err := st.Write(chunk); err != nil {
				writeErr <- err
				return
			}
		}
		writeErr <- nil
	})
	ts := startServer(t, &ServerConfig{WriteStallTimeout: 500 * time.Millisecond}, h, nil)
	stop := wellBehaved(t, ts.addr())
	before := heapInUse()
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	c, err := d.Dial("tcp", ts.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fr := http2.NewFramer(c, c)
	c.Write([]byte(http2.ClientPreface))
	fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: maxWindow})
	fr.WriteWindowUpdate(0, maxWindow-65535)
	rc := &rawClient{t: t, c: c, fr: fr}
	rc.enc = hpack.NewEncoder(&rc.buf)
	rc.headers(1, rc.block("GET", "/big"), true)
	select {
	case err := <-writeErr:
		if err == nil {
			t.Errorf("handler wrote 6.5 GB to a client that never reads")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("handler's Write still blocked 30s after the client stopped reading")
	}
	served, failure := stop()
	if failure != nil || served == 0 {
		t.Errorf("well-behaved client: %d served, %v", served, failure)
	}
	if after := heapInUse(); after > before+64<<20 {
		t.Errorf("heap grew from %d to %d", before, after)
	}
}
