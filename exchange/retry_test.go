package exchange

import (
	"context"
	"fmt"
	"io"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/h2"
	"github.com/hotproxy/hotproxy/http1"
	"github.com/hotproxy/hotproxy/upstream"
)

// fakeAccounting records what a run of tries reported.
type fakeAccounting struct {
	reports            [][2]int
	retries, successes int
}

func (f *fakeAccounting) ReportStatus(endpoint, status int) {
	f.reports = append(f.reports, [2]int{endpoint, status})
}
func (f *fakeAccounting) CountRetry()        { f.retries++ }
func (f *fakeAccounting) CountRetrySuccess() { f.successes++ }

func start(tb testing.TB, p RetryPolicy, replayable, idempotent bool) (*Tries, *fakeAccounting) {
	tb.Helper()
	acct := &fakeAccounting{}
	t := &Tries{}
	t.Start(&p, acct, time.Now(), time.Minute, replayable, idempotent)
	return t, acct
}

func TestTriesStatusRetryThenSuccess(t *testing.T) {
	tr, acct := start(t, RetryPolicy{On: Retry5xx, Num: 1}, true, true)
	if v := tr.Next(nil, 503, Try{Endpoint: 0}); v != Retry {
		t.Fatalf("503 with a retry left: %v, want Retry", v)
	}
	if v := tr.Next(nil, 200, Try{Endpoint: 1}); v != Accept {
		t.Fatalf("200: %v, want Accept", v)
	}
	if acct.retries != 1 || acct.successes != 1 || tr.Retries != 1 {
		t.Errorf("retries %d, successes %d, Retries %d: want 1, 1, 1", acct.retries, acct.successes, tr.Retries)
	}
	if len(acct.reports) != 1 || acct.reports[0] != [2]int{0, 503} {
		t.Errorf("outlier reports %v, want the retried 503 of endpoint 0 alone", acct.reports)
	}
}

func TestTriesRetriesExhaustedAcceptsLast(t *testing.T) {
	tr, acct := start(t, RetryPolicy{On: Retry5xx, Num: 1}, true, true)
	tr.Next(nil, 500, Try{Endpoint: 0})
	if v := tr.Next(nil, 500, Try{Endpoint: 1}); v != Accept {
		t.Fatalf("the last 500: %v, want Accept (forwarded as it came)", v)
	}
	if acct.successes != 0 {
		t.Errorf("a retried 500 counted as a retry success")
	}
}

// A request that cannot be sent again (its body streams) is tried once,
// and its response is no retry's success.
func TestTriesNotReplayable(t *testing.T) {
	tr, acct := start(t, RetryPolicy{On: Retry5xx | RetryConnectFailure, Num: 3}, false, true)
	if v := tr.Next(&upstream.ConnectError{Err: syscall.ECONNREFUSED}, 0, Try{Endpoint: -1}); v != Fail {
		t.Fatalf("connect failure of a streamed request: %v, want Fail", v)
	}
	tr, acct = start(t, RetryPolicy{On: Retry5xx, Num: 3}, false, true)
	if v := tr.Next(nil, 200, Try{Endpoint: 0}); v != Accept || acct.successes != 0 || acct.retries != 0 {
		t.Fatalf("200 of a streamed request: %v, %d successes, %d retries; want Accept, 0, 0", v, acct.successes, acct.retries)
	}
}

func TestTriesErrors(t *testing.T) {
	malformed := &http1.Error{Status: 502, Reason: "bad"}
	for _, tt := range []struct {
		name       string
		p          RetryPolicy
		idempotent bool
		err        error
		try        Try
		want       Verdict
	}{
		{"connect failure", RetryPolicy{On: RetryConnectFailure, Num: 1}, false, &upstream.ConnectError{Err: syscall.ECONNREFUSED}, Try{Endpoint: -1}, Retry},
		{"connect failure not asked for", RetryPolicy{On: Retry5xx, Num: 1}, true, &upstream.ConnectError{Err: syscall.ECONNREFUSED}, Try{Endpoint: -1}, Fail},
		{"reset", RetryPolicy{On: RetryReset, Num: 1}, true, syscall.ECONNRESET, Try{Endpoint: 0}, Retry},
		{"reset of a POST", RetryPolicy{On: RetryReset, Num: 1}, false, syscall.ECONNRESET, Try{Endpoint: 0}, Fail},
		{"reset of a POST, retry_non_idempotent", RetryPolicy{On: RetryReset, Num: 1, NonIdempotent: true}, false, syscall.ECONNRESET, Try{Endpoint: 0}, Retry},
		{"reset after a 1xx", RetryPolicy{On: RetryReset, Num: 1}, true, syscall.ECONNRESET, Try{Endpoint: 0, Interim: true}, Fail},
		{"malformed response, reset only", RetryPolicy{On: RetryReset, Num: 1}, true, malformed, Try{Endpoint: 0}, Fail},
		{"malformed response, 5xx", RetryPolicy{On: Retry5xx, Num: 1}, true, malformed, Try{Endpoint: 0}, Retry},
		{"per-try timeout, gateway-error", RetryPolicy{On: RetryGatewayError, Num: 1}, true, os.ErrDeadlineExceeded, Try{Endpoint: 0}, Retry},
		{"context timeout, gateway-error", RetryPolicy{On: RetryGatewayError, Num: 1}, true, context.DeadlineExceeded, Try{Endpoint: 0}, Retry},
		{"reset, gateway-error only", RetryPolicy{On: RetryGatewayError, Num: 1}, true, syscall.ECONNRESET, Try{Endpoint: 0}, Fail},
		{"client body", RetryPolicy{On: Retry5xx, Num: 1}, true, ErrClientBody, Try{Endpoint: 0}, Fail},
		{"client gone", RetryPolicy{On: Retry5xx, Num: 1}, true, context.Canceled, Try{Endpoint: 0}, Fail},
		{"breaker", RetryPolicy{On: Retry5xx, Num: 1}, true, upstream.ErrOverflow, Try{Endpoint: -1}, Fail},
		{"stale connection, no policy", RetryPolicy{}, true, io.EOF, Try{Endpoint: 0, Stale: true}, RetryFresh},
		{"stale connection of a POST", RetryPolicy{}, false, io.EOF, Try{Endpoint: 0, Stale: true}, Fail},
		{"stale connection timing out", RetryPolicy{}, true, os.ErrDeadlineExceeded, Try{Endpoint: 0, Stale: true}, Fail},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tr, acct := start(t, tt.p, true, tt.idempotent)
			if v := tr.Next(tt.err, 0, tt.try); v != tt.want {
				t.Fatalf("Next(%v) = %v, want %v", tt.err, v, tt.want)
			}
			wantReports := 0
			if tt.want == Retry && tt.try.Endpoint >= 0 {
				wantReports = 1
			}
			if len(acct.reports) != wantReports {
				t.Errorf("outlier reports %v, want %d", acct.reports, wantReports)
			}
			if tt.want == RetryFresh && (acct.retries != 0 || tr.Retries != 1) {
				t.Errorf("a stale connection's retry counted %d in upstream_rq_retry, %d in Retries; want 0, 1", acct.retries, tr.Retries)
			}
		})
	}
}

// The stale-connection retry is the first try's alone, and once.
func TestTriesStaleOnce(t *testing.T) {
	tr, _ := start(t, RetryPolicy{}, true, true)
	if v := tr.Next(io.EOF, 0, Try{Endpoint: 0, Stale: true}); v != RetryFresh {
		t.Fatalf("first stale try: %v, want RetryFresh", v)
	}
	if v := tr.Next(io.EOF, 0, Try{Endpoint: 0, Stale: true}); v != Fail {
		t.Fatalf("second stale try: %v, want Fail", v)
	}
}

// No try starts after the request's deadline, and a try's deadline is
// per_try_timeout's when that is sooner.
func TestTriesDeadlines(t *testing.T) {
	acct := &fakeAccounting{}
	var tr Tries
	p := RetryPolicy{On: Retry5xx, Num: 5, PerTry: time.Second}
	begun := time.Now().Add(-2 * time.Minute)
	tr.Start(&p, acct, begun, time.Minute, true, true)
	if v := tr.Next(nil, 503, Try{Endpoint: 0}); v != Accept {
		t.Fatalf("503 past the request deadline: %v, want Accept", v)
	}
	tr.Start(&p, acct, time.Now(), time.Minute, true, true)
	if d := time.Until(tr.TryDeadline()); d > time.Second || d <= 0 {
		t.Errorf("try deadline in %v, want within per_try_timeout (1s)", d)
	}
	if !tr.PerTry() {
		t.Error("PerTry() false with per_try_timeout set")
	}
}

// A try's deadline fires at most a sixteenth of its own timeout late (the
// route's, or per_try_timeout when shorter), and never more than 10ms.
func TestTriesDeadlineSlack(t *testing.T) {
	for _, c := range []struct {
		timeout, perTry, want time.Duration
	}{
		{15 * time.Second, 0, 10 * time.Millisecond},
		{100 * time.Millisecond, 0, 6250 * time.Microsecond},
		{10 * time.Millisecond, 0, 625 * time.Microsecond},
		{time.Minute, 80 * time.Millisecond, 5 * time.Millisecond},
		{80 * time.Millisecond, time.Minute, 5 * time.Millisecond}, // per_try_timeout longer: the route's bounds
	} {
		var tr Tries
		p := RetryPolicy{PerTry: c.perTry}
		tr.Start(&p, &fakeAccounting{}, time.Now(), c.timeout, true, true)
		if got := tr.DeadlineSlack(); got != c.want {
			t.Errorf("timeout %v, per_try_timeout %v: slack %v, want %v", c.timeout, c.perTry, got, c.want)
		}
	}
}

// Tries allocates nothing: it lives in the HTTP/1.1 front end's pooled
// state, whose requests cost no allocation.
func TestTriesAllocatesNothing(t *testing.T) {
	acct := &fakeAccounting{reports: make([][2]int, 0, 1000)}
	p := RetryPolicy{On: Retry5xx | RetryReset, Num: 1}
	var tr Tries
	now := time.Now()
	allocs := testing.AllocsPerRun(100, func() {
		tr.Start(&p, acct, now, time.Minute, true, true)
		tr.Next(nil, 503, Try{Endpoint: 0})
		tr.Next(nil, 200, Try{Endpoint: 1})
	})
	if allocs != 0 {
		t.Errorf("%v allocations per run of tries, want 0", allocs)
	}
}

// scriptedTransport answers tries from a script of statuses and errors.
type scriptedTransport struct {
	statuses  []int
	errs      []error
	tries     []string // "n avoid fresh" per try
	abandoned int
}

func (s *scriptedTransport) Try(n, avoid int, fresh bool, _ time.Time) (int, Try, error) {
	s.tries = append(s.tries, fmt.Sprint(n, avoid, fresh))
	return s.statuses[n], Try{Endpoint: 10 + n, Stale: true}, s.errs[n]
}

func (s *scriptedTransport) Abandon() { s.abandoned++ }

// RoundTrip asks the policy after every try and tells the transport
// which endpoint to avoid next: a stale connection's endpoint on a fresh
// connection, then another.
func TestRoundTrip(t *testing.T) {
	tr, acct := start(t, RetryPolicy{On: Retry5xx, Num: 2}, true, true)
	s := &scriptedTransport{statuses: []int{0, 503, 200}, errs: []error{io.EOF, nil, nil}}
	if err := RoundTrip(tr, s); err != nil {
		t.Fatalf("RoundTrip: %v, want the 200", err)
	}
	want := []string{"0 -1 false", "1 10 true", "2 11 false"}
	if fmt.Sprint(s.tries) != fmt.Sprint(want) || s.abandoned != 2 {
		t.Errorf("tries %q, %d abandoned; want %q, 2", s.tries, s.abandoned, want)
	}
	if tr.Retries != 2 || acct.retries != 1 || acct.successes != 1 {
		t.Errorf("Retries %d, upstream_rq_retry %d, success %d; want 2, 1, 1", tr.Retries, acct.retries, acct.successes)
	}
}

// TestTriesRefusedStreamRetriedOnceFree: an HTTP/2 stream the upstream
// refused (REFUSED_STREAM, above a GOAWAY's last-stream-id) was never
// processed: a replayable request is sent again whatever its method and
// with no retry policy, once, not counted against num_retries nor
// reported to outlier detection; a second refusal follows retry_on; a
// request whose body streamed cannot be sent again.
func TestTriesRefusedStreamRetriedOnceFree(t *testing.T) {
	refused := fmt.Errorf("try: %w", &h2.ClientRefusedError{StreamID: 1, Reason: "peer reset it with REFUSED_STREAM"})
	tr, acct := start(t, RetryPolicy{}, true, false) // a POST, no policy
	if v := tr.Next(refused, 0, Try{Endpoint: 0}); v != Retry {
		t.Fatalf("refused POST: %v, want Retry", v)
	}
	if v := tr.Next(refused, 0, Try{Endpoint: 0}); v != Fail {
		t.Fatalf("refused again with no policy: %v, want Fail", v)
	}
	if acct.retries != 0 || len(acct.reports) != 0 || tr.Retries != 1 {
		t.Errorf("retries %d, reports %v, Retries %d: want 0, none, 1", acct.retries, acct.reports, tr.Retries)
	}

	tr, acct = start(t, RetryPolicy{On: RetryReset, Num: 1}, true, false)
	tr.Next(refused, 0, Try{Endpoint: 0})
	if v := tr.Next(refused, 0, Try{Endpoint: 1}); v != Retry {
		t.Fatalf("second refusal with retry_on reset: %v, want Retry", v)
	}
	if v := tr.Next(nil, 200, Try{Endpoint: 0}); v != Accept || acct.retries != 1 {
		t.Fatalf("200: %v with %d retries counted, want Accept and 1", v, acct.retries)
	}

	tr, _ = start(t, RetryPolicy{On: RetryReset, Num: 3}, false, true)
	if v := tr.Next(refused, 0, Try{Endpoint: 0}); v != Fail {
		t.Errorf("refused streamed body: %v, want Fail (it cannot be sent again)", v)
	}
}

func TestIdempotent(t *testing.T) {
	for m, want := range map[string]bool{"GET": true, "HEAD": true, "OPTIONS": true, "TRACE": true, "PUT": true, "DELETE": true,
		"POST": false, "PATCH": false, "CONNECT": false, "get": false, "": false} {
		if got := Idempotent(m); got != want {
			t.Errorf("Idempotent(%q) = %v, want %v", m, got, want)
		}
	}
}

// A request whose body streams (not replayable) goes again on a fresh
// connection after a stale one only when none of its body was taken
// (BodyUnsent: an Expect: 100-continue client waiting), a POST too.
func TestTriesStaleBodyUnsent(t *testing.T) {
	for _, tt := range []struct {
		name string
		err  error
		try  Try
		want Verdict
	}{
		{"head alone sent", io.EOF, Try{Endpoint: 0, Stale: true, BodyUnsent: true}, RetryFresh},
		{"head alone sent, reset", syscall.ECONNRESET, Try{Endpoint: 0, Stale: true, BodyUnsent: true}, RetryFresh},
		{"body partly sent", io.EOF, Try{Endpoint: 0, Stale: true}, Fail},
		{"not a reused connection", io.EOF, Try{Endpoint: 0, BodyUnsent: true}, Fail},
		{"timing out", os.ErrDeadlineExceeded, Try{Endpoint: 0, Stale: true, BodyUnsent: true}, Fail},
		{"after a 1xx", io.EOF, Try{Endpoint: 0, Interim: true}, Fail},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tr, _ := start(t, RetryPolicy{}, false, false)
			if v := tr.Next(tt.err, 0, tt.try); v != tt.want {
				t.Fatalf("Next(%v, %+v) = %v, want %v", tt.err, tt.try, v, tt.want)
			}
		})
	}
}
