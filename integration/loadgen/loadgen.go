// Package loadgen generates HTTP load against one URL with N concurrent
// clients for a bounded count and duration, and counts every outcome by
// class, honestly: it is the measure behind "zero failed requests across
// hot restarts", so it must not let the HTTP client hide a failure.
//
// # Modes
//
// KeepAlive: each client goroutine has its own http.Transport and reuses
// one connection. A response with "Connection: close" makes the transport
// close that connection; the next request dials a new one. That is not an
// error and is not counted as one.
//
// ConnPerRequest: each request dials a fresh connection (DisableKeepAlives)
// and the connection is closed after the response.
//
// HTTP2: each client has its own golang.org/x/net/http2.Transport, one
// connection at a time, and Options.Streams goroutines sending requests
// on it at once (multiplexed streams). An https URL negotiates h2 by ALPN
// (a server that picks anything else fails the dial); an http URL speaks
// h2c with prior knowledge over a plain dial. A GOAWAY makes the
// transport finish the streams it covers and open a new connection for
// the next ones. See h2.go.
//
// # Transport retries
//
// net/http's Transport silently retries a request on a new connection when a
// reused keep-alive connection fails before any response byte arrives
// (persistConn.shouldRetryRequest: nothing written yet, or an idempotent
// request whose read of the first response byte failed, or "server closed
// idle connection"). The caller sees only the successful second attempt. In a
// hot restart this is precisely the race we must not hide: the old
// generation closed a connection a client had already chosen to use. So
// every request carries an httptrace.ClientTrace, and a request that got a
// connection more than once was retried by the transport. Such a request is
// counted in Retried and, unless Options.TolerateRetries is set, as a
// failure. Connection-per-request mode never retries (a fresh connection is
// never retried).
//
// HTTP/2 is different: x/net's client retries a request only when the
// server said it did not process it (a stream above a GOAWAY's last stream
// id, or RST_STREAM REFUSED_STREAM) or before it was sent (a connection
// found unusable): the protocol's own promise, not a guess. So in HTTP2
// mode a retried request is counted in Retried and never as a failure; a
// request fails only if the transport returned an error to the caller, or
// the status or body was wrong.
//
// # TLS
//
// An https URL makes every mode TLS: keep-alive and HTTP2 do one handshake
// per connection, connection-per-request one per request. Options.TLS is the
// client config (ClientTLS builds one that trusts a CA file and sends a
// server name); with SessionCache each client keeps its own session cache,
// as a browser does, so that a reconnect can resume. Every completed
// handshake is counted as full or resumed (tls.ConnectionState.DidResume),
// which is how a test sees whether tickets survived a hot restart. A
// failed handshake is ClassTLS.
package loadgen

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/http2"
)

// Mode says how clients use connections.
type Mode int

const (
	// KeepAlive reuses one connection per client while the server keeps it.
	KeepAlive Mode = iota
	// ConnPerRequest dials a fresh connection for every request.
	ConnPerRequest
	// HTTP2 multiplexes Options.Streams concurrent streams per client
	// over one HTTP/2 connection (h2 over TLS, or h2c).
	HTTP2
)

func (m Mode) String() string {
	switch m {
	case KeepAlive:
		return "keep-alive"
	case ConnPerRequest:
		return "conn-per-request"
	case HTTP2:
		return "http2"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Defaults for Options, exported so that tests and docs can name them.
const (
	DefaultClients           = 4
	DefaultDuration          = 2 * time.Second
	DefaultMaxDuration       = 60 * time.Second
	DefaultTimeout           = 5 * time.Second
	DefaultPauseAfterFailure = 5 * time.Millisecond
	DefaultStreams           = 4
	// maxExamples bounds the example messages kept per class.
	maxExamples = 5
)

// Options configures a Run. The zero value of every field is its default.
type Options struct {
	// URL is requested by every client. Required.
	URL string
	// Method defaults to GET. Body, if set, is sent with every request
	// (as a fixed Content-Length body).
	Method string
	Body   []byte
	// Header is added to every request.
	Header http.Header

	Mode Mode
	// Clients is the number of concurrent clients (DefaultClients).
	Clients int
	// Streams is, in HTTP2 mode, the number of requests each client keeps
	// in flight at once on its connection (DefaultStreams). Requests,
	// Rate and PauseAfterFailure then apply per stream.
	Streams int
	// Requests, if > 0, stops the run after this many requests in total.
	Requests int
	// Duration stops the run after this long (DefaultDuration when
	// Requests is 0; with Requests > 0, DefaultMaxDuration as a bound).
	// A run is always bounded by both a duration and its context.
	Duration time.Duration
	// Timeout bounds each request, from start to the end of the body
	// (DefaultTimeout).
	Timeout time.Duration
	// Rate, if > 0, paces each client to at most this many requests per
	// second; 0 is as fast as possible.
	Rate float64
	// PauseAfterFailure is how long a client sleeps after a failed request
	// so that a refused port does not become a busy loop
	// (DefaultPauseAfterFailure; negative: no pause).
	PauseAfterFailure time.Duration

	// ExpectStatus is the status counted as OK (200).
	ExpectStatus int
	// Check, if set, validates a response with the expected status and
	// its whole body; an error counts the request as ClassBadBody.
	Check func(resp *http.Response, body []byte) error

	// TolerateRetries keeps requests the transport retried out of
	// Failed(). They are still counted in Retried.
	TolerateRetries bool

	// TLS is the client config for an https URL, cloned per client (see
	// ClientTLS). nil: certificates are not verified, as before TLS
	// tests existed; an http URL ignores it.
	TLS *tls.Config
	// Observe, if set, is called after every request that counts, with
	// its start, its end (the body read) and its class: how a test sees
	// which requests were in flight at a given moment. It runs on the
	// client's goroutine and must be quick.
	Observe func(start, end time.Time, class Class)

	// SessionCache gives each client a TLS session cache of its own
	// (tls.NewLRUClientSessionCache) unless TLS sets one, so that new
	// connections resume with the tickets earlier ones got.
	SessionCache bool
}

// ClientTLS returns a client config that trusts only the PEM certificates
// in caFile and sends serverName as SNI (and verifies the certificate
// against it), as a client of a proxy listener with that name does.
func ClientTLS(caFile, serverName string) (*tls.Config, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("loadgen: CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("loadgen: CA file %s: no PEM certificate in it", caFile)
	}
	return &tls.Config{RootCAs: pool, ServerName: serverName}, nil
}

// Class is the outcome of one request.
type Class int

// Outcome classes.
const (
	ClassOK Class = iota
	// ClassRefused: the dial was refused (ECONNREFUSED).
	ClassRefused
	// ClassReset: the connection was reset (ECONNRESET) or written after
	// the peer closed it (EPIPE), before the response was complete.
	ClassReset
	// ClassEOF: the connection ended before a response head arrived.
	ClassEOF
	// ClassTruncated: the response head arrived but the body ended early.
	ClassTruncated
	// ClassTimeout: the request did not finish within Options.Timeout.
	ClassTimeout
	// ClassStatus: a response with a status other than ExpectStatus.
	ClassStatus
	// ClassBadBody: Options.Check rejected the response.
	ClassBadBody
	// ClassTLS: the TLS handshake failed (an alert from the server, a
	// certificate that did not verify, a non-TLS answer).
	ClassTLS
	// ClassStreamReset: the HTTP/2 server reset the stream (RST_STREAM)
	// with a code the client does not retry on.
	ClassStreamReset
	// ClassOther: anything else; examples are kept.
	ClassOther
	numClasses
)

var classNames = [numClasses]string{"ok", "refused", "reset", "eof", "truncated", "timeout", "status", "bad_body", "tls", "stream_reset", "other"}

func (c Class) String() string {
	if c >= 0 && c < numClasses {
		return classNames[c]
	}
	return fmt.Sprintf("Class(%d)", int(c))
}

// Result counts the outcomes of a run.
type Result struct {
	Mode    Mode
	Elapsed time.Duration
	// Counts is indexed by Class.
	Counts [numClasses]int64
	// Statuses counts unexpected statuses (ClassStatus) by code.
	Statuses map[int]int64
	// Retried counts requests the transport retried on a new connection
	// after a reused one failed (see the package doc). A retried request
	// is also counted under the class of its final outcome.
	Retried int64
	// Conns counts connections dialled.
	Conns int64
	// FullHandshakes and ResumedHandshakes count the TLS handshakes
	// completed (an https URL): resumed ones used a session ticket from
	// the client's SessionCache.
	FullHandshakes, ResumedHandshakes int64
	// GoAways counts the GOAWAY frames HTTP/2 servers sent the clients;
	// ClosedWithoutGoAway the HTTP/2 connections the server ended (EOF
	// or an error on read while the client still used them) without a
	// GOAWAY first, which is how a server loses the requests a client
	// was sending at that moment.
	GoAways, ClosedWithoutGoAway int64
	// Examples keeps a few error messages per failing class.
	Examples map[Class][]string

	tolerateRetries bool
}

// Total returns the number of requests that finished (any class).
func (r Result) Total() int64 {
	var n int64
	for _, c := range r.Counts {
		n += c
	}
	return n
}

// OK returns the number of requests counted ClassOK.
func (r Result) OK() int64 { return r.Counts[ClassOK] }

// Count returns the number of requests in class c.
func (r Result) Count(c Class) int64 { return r.Counts[c] }

// Failed returns the number of requests that did not succeed, plus the
// requests the transport retried unless Options.TolerateRetries.
func (r Result) Failed() int64 {
	n := r.Total() - r.Counts[ClassOK]
	if !r.tolerateRetries {
		n += r.Retried
	}
	return n
}

// FailedExcept returns Failed() minus the requests in the given classes.
func (r Result) FailedExcept(classes ...Class) int64 {
	n := r.Failed()
	for _, c := range classes {
		if c != ClassOK {
			n -= r.Counts[c]
		}
	}
	return n
}

// String summarises the result on one line plus examples.
func (r Result) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d requests in %v over %d conns, %d failed:", r.Mode, r.Total(), r.Elapsed.Round(time.Millisecond), r.Conns, r.Failed())
	if n := r.FullHandshakes + r.ResumedHandshakes; n != 0 {
		fmt.Fprintf(&b, " (TLS handshakes: %d full, %d resumed)", r.FullHandshakes, r.ResumedHandshakes)
	}
	if r.Mode == HTTP2 {
		fmt.Fprintf(&b, " (GOAWAYs %d, closed without GOAWAY %d)", r.GoAways, r.ClosedWithoutGoAway)
	}
	for c := Class(0); c < numClasses; c++ {
		if r.Counts[c] != 0 {
			fmt.Fprintf(&b, " %s=%d", c, r.Counts[c])
		}
	}
	if r.Retried != 0 {
		fmt.Fprintf(&b, " retried=%d", r.Retried)
	}
	if len(r.Statuses) != 0 {
		codes := make([]int, 0, len(r.Statuses))
		for code := range r.Statuses {
			codes = append(codes, code)
		}
		sort.Ints(codes)
		b.WriteString(" statuses{")
		for i, code := range codes {
			if i > 0 {
				b.WriteString(" ")
			}
			fmt.Fprintf(&b, "%d:%d", code, r.Statuses[code])
		}
		b.WriteString("}")
	}
	for c := Class(0); c < numClasses; c++ {
		for _, ex := range r.Examples[c] {
			fmt.Fprintf(&b, "\n  %s: %s", c, ex)
		}
	}
	return b.String()
}

// Run is a load generation in progress.
type Run struct {
	opts   Options
	cancel context.CancelFunc
	done   chan struct{}
	start  time.Time
	issued atomic.Int64 // requests started, for the Requests bound
	conns  atomic.Int64 // connections dialled

	fullHandshakes, resumedHandshakes atomic.Int64
	goAways, closedWithoutGoAway      atomic.Int64

	mu     sync.Mutex // guards result
	result Result
	end    time.Time
}

// Start starts the clients and returns at once. The run ends when its
// request count or duration is reached, ctx ends, or Stop is called.
func Start(ctx context.Context, opts Options) (*Run, error) {
	if opts.URL == "" {
		return nil, errors.New("loadgen: no URL")
	}
	if opts.Method == "" {
		opts.Method = http.MethodGet
	}
	if opts.Clients <= 0 {
		opts.Clients = DefaultClients
	}
	if opts.Duration <= 0 {
		if opts.Requests > 0 {
			opts.Duration = DefaultMaxDuration
		} else {
			opts.Duration = DefaultDuration
		}
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.PauseAfterFailure == 0 {
		opts.PauseAfterFailure = DefaultPauseAfterFailure
	}
	if opts.ExpectStatus == 0 {
		opts.ExpectStatus = http.StatusOK
	}
	if opts.Streams <= 0 {
		opts.Streams = DefaultStreams
	}
	if opts.Mode == HTTP2 {
		// See "Transport retries" in the package doc.
		opts.TolerateRetries = true
	}
	if _, err := http.NewRequest(opts.Method, opts.URL, nil); err != nil {
		return nil, fmt.Errorf("loadgen: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, opts.Duration)
	r := &Run{
		opts:   opts,
		cancel: cancel,
		done:   make(chan struct{}),
		start:  time.Now(),
		result: Result{
			Mode:            opts.Mode,
			Statuses:        map[int]int64{},
			Examples:        map[Class][]string{},
			tolerateRetries: opts.TolerateRetries,
		},
	}
	var wg sync.WaitGroup
	for i := 0; i < opts.Clients; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.client(ctx)
		}()
	}
	go func() {
		wg.Wait()
		r.mu.Lock()
		r.end = time.Now()
		r.mu.Unlock()
		cancel()
		close(r.done)
	}()
	return r, nil
}

// Do runs a load generation to its end and returns the result.
func Do(ctx context.Context, opts Options) (Result, error) {
	r, err := Start(ctx, opts)
	if err != nil {
		return Result{}, err
	}
	return r.Wait(), nil
}

// Stop ends the run: requests in flight are cancelled and are not counted.
// It waits for the clients to return and gives the result.
func (r *Run) Stop() Result {
	r.cancel()
	return r.Wait()
}

// Wait waits for the run to end and returns the result.
func (r *Run) Wait() Result {
	<-r.done
	return r.Snapshot()
}

// Done is closed when the run has ended.
func (r *Run) Done() <-chan struct{} { return r.done }

// Snapshot returns the counts so far.
func (r *Run) Snapshot() Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	res := r.result
	res.Conns = r.conns.Load()
	res.FullHandshakes = r.fullHandshakes.Load()
	res.ResumedHandshakes = r.resumedHandshakes.Load()
	res.GoAways = r.goAways.Load()
	res.ClosedWithoutGoAway = r.closedWithoutGoAway.Load()
	res.Statuses = make(map[int]int64, len(r.result.Statuses))
	for k, v := range r.result.Statuses {
		res.Statuses[k] = v
	}
	res.Examples = make(map[Class][]string, len(r.result.Examples))
	for k, v := range r.result.Examples {
		res.Examples[k] = append([]string(nil), v...)
	}
	if r.end.IsZero() {
		res.Elapsed = time.Since(r.start)
	} else {
		res.Elapsed = r.end.Sub(r.start)
	}
	return res
}

// WaitTotal waits until at least n requests have finished, the run ends, or
// timeout passes, and reports whether n was reached.
func (r *Run) WaitTotal(n int64, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		r.mu.Lock()
		total := r.result.Total()
		r.mu.Unlock()
		if total >= n {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		select {
		case <-r.done:
			return r.Snapshot().Total() >= n
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func (r *Run) client(ctx context.Context) {
	if r.opts.Mode == HTTP2 {
		r.clientHTTP2(ctx)
		return
	}
	dialer := &net.Dialer{Timeout: r.opts.Timeout}
	tr := &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			r.conns.Add(1)
			return dialer.DialContext(ctx, network, addr)
		},
		TLSClientConfig:     r.clientTLS(),
		DisableKeepAlives:   r.opts.Mode == ConnPerRequest,
		DisableCompression:  true,
		MaxIdleConnsPerHost: 1,
		IdleConnTimeout:     90 * time.Second,
		// Never negotiate HTTP/2: the count must be per connection.
		TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{},
	}
	defer tr.CloseIdleConnections()
	r.requestLoop(ctx, tr)
}

// requestLoop sends requests through tr one after the other until the
// run ends, and records each outcome.
func (r *Run) requestLoop(ctx context.Context, tr http.RoundTripper) {
	var interval time.Duration
	if r.opts.Rate > 0 {
		interval = time.Duration(float64(time.Second) / r.opts.Rate)
	}
	next := time.Now()
	for ctx.Err() == nil {
		if r.opts.Requests > 0 && r.issued.Add(1) > int64(r.opts.Requests) {
			return
		}
		if interval > 0 {
			if d := time.Until(next); d > 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(d):
				}
			}
			next = next.Add(interval)
		}
		start := time.Now()
		class, status, retried, err := r.one(ctx, tr)
		if ctx.Err() != nil && class != ClassOK {
			// Cancelled by the end of the run: not an outcome.
			return
		}
		if r.opts.Observe != nil {
			r.opts.Observe(start, time.Now(), class)
		}
		r.record(class, status, retried, err)
		if class != ClassOK && r.opts.PauseAfterFailure > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(r.opts.PauseAfterFailure):
			}
		}
	}
}

// clientTLS is one client's TLS config.
func (r *Run) clientTLS() *tls.Config {
	var c *tls.Config
	if r.opts.TLS != nil {
		c = r.opts.TLS.Clone()
	} else {
		c = &tls.Config{InsecureSkipVerify: true}
	}
	if r.opts.SessionCache && c.ClientSessionCache == nil {
		c.ClientSessionCache = tls.NewLRUClientSessionCache(0)
	}
	// HTTP/1.1 only: the counts are per connection (see TLSNextProto in
	// client), and a server offering h2 must not be told we speak it.
	c.NextProtos = slices.DeleteFunc(slices.Clone(c.NextProtos), func(p string) bool { return p == "h2" })
	return c
}

// one sends one request and classifies its outcome.
func (r *Run) one(ctx context.Context, tr http.RoundTripper) (class Class, status int, retried bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, r.opts.Timeout)
	defer cancel()
	var gotConn atomic.Int32
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(httptrace.GotConnInfo) { gotConn.Add(1) },
		TLSHandshakeDone: func(st tls.ConnectionState, err error) {
			switch {
			case err != nil:
			case st.DidResume:
				r.resumedHandshakes.Add(1)
			default:
				r.fullHandshakes.Add(1)
			}
		},
	})
	var body io.Reader
	if r.opts.Body != nil {
		body = bytes.NewReader(r.opts.Body)
	}
	req, err := http.NewRequestWithContext(ctx, r.opts.Method, r.opts.URL, body)
	if err != nil {
		return ClassOther, 0, false, err
	}
	for k, vs := range r.opts.Header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	resp, err := tr.RoundTrip(req)
	// GotConn runs once per attempt, before RoundTrip returns; more than
	// one attempt means the transport retried.
	retried = gotConn.Load() > 1
	if err != nil {
		return Classify(err, false), 0, retried, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return Classify(err, true), resp.StatusCode, retried, err
	}
	if resp.StatusCode != r.opts.ExpectStatus {
		return ClassStatus, resp.StatusCode, retried, fmt.Errorf("status %s", resp.Status)
	}
	if r.opts.Check != nil {
		if err := r.opts.Check(resp, b); err != nil {
			return ClassBadBody, resp.StatusCode, retried, err
		}
	}
	return ClassOK, resp.StatusCode, retried, nil
}

func (r *Run) record(class Class, status int, retried bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.result.Counts[class]++
	if class == ClassStatus {
		r.result.Statuses[status]++
	}
	if retried {
		r.result.Retried++
	}
	if err != nil && len(r.result.Examples[class]) < maxExamples {
		r.result.Examples[class] = append(r.result.Examples[class], err.Error())
	}
}

// Classify maps a transport error to its class. inBody says the response
// head had already arrived (the error came from reading the body).
func Classify(err error, inBody bool) Class {
	switch {
	case err == nil:
		return ClassOK
	case errors.Is(err, syscall.ECONNREFUSED):
		return ClassRefused
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return ClassReset
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		return ClassTimeout
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return ClassTimeout
	}
	if isTLSError(err) {
		return ClassTLS
	}
	var se http2.StreamError
	if errors.As(err, &se) {
		return ClassStreamReset
	}
	var ga http2.GoAwayError
	if errors.As(err, &ga) {
		// The connection ended after a GOAWAY whose last stream id
		// covered this request, before its response was complete.
		if inBody {
			return ClassTruncated
		}
		return ClassEOF
	}
	if inBody {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return ClassTruncated
		}
		return ClassOther
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		strings.Contains(err.Error(), "server closed idle connection") {
		return ClassEOF
	}
	return ClassOther
}

// isTLSError reports whether err is a failed TLS handshake: an alert the
// server sent, a certificate that did not verify, or a record that was not
// TLS.
func isTLSError(err error) bool {
	var alert tls.AlertError
	var verify *tls.CertificateVerificationError
	var record tls.RecordHeaderError
	var unknownAuthority x509.UnknownAuthorityError
	var hostname x509.HostnameError
	return errors.As(err, &alert) || errors.As(err, &verify) || errors.As(err, &record) ||
		errors.As(err, &unknownAuthority) || errors.As(err, &hostname) ||
		strings.HasPrefix(err.Error(), "tls: ") || strings.Contains(err.Error(), ": tls: ")
}
