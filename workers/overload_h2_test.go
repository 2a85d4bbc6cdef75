package workers

import (
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// TestOverloadHTTP2: on an HTTP/2 connection, refuse_requests answers a
// stream 503 with Retry-After and sends a GOAWAY; disable_keepalive alone
// serves the stream and sends a GOAWAY.
func TestOverloadHTTP2(t *testing.T) {
	be := echoBackend(t)
	m := startManager(t, proxyConfig(hostOf(be.URL), h2cListener), 1)
	a := addr(t, m, "web")
	for _, tc := range []struct {
		name       string
		st         OverloadState
		status     string
		retryAfter string
	}{
		{"refuse_requests", OverloadState{RefuseRequests: true, RetryAfter: 7 * time.Second}, "503", "7"},
		{"disable_keepalive", OverloadState{DisableKeepAlive: true}, "200", ""},
	} {
		m.SetOverload(tc.st)
		rc := dialRawH2(t, a)
		rc.get(t, 1, a, "/x")
		var goAway *http2.GoAwayFrame
		status, retryAfter, ended := "", "", false
		for !ended || goAway == nil {
			f, err := rc.fr.ReadFrame()
			if err != nil {
				t.Fatalf("%s: reading frames (GOAWAY seen: %v, status %q): %v", tc.name, goAway != nil, status, err)
			}
			switch f := f.(type) {
			case *http2.GoAwayFrame:
				goAway = f
			case *http2.SettingsFrame:
				if !f.IsAck() {
					rc.fr.WriteSettingsAck()
				}
			case *http2.MetaHeadersFrame:
				status = f.PseudoValue("status")
				for _, hf := range f.RegularFields() {
					if hf.Name == "retry-after" {
						retryAfter = hf.Value
					}
				}
				ended = ended || f.StreamEnded()
			case *http2.DataFrame:
				ended = ended || f.StreamEnded()
			}
		}
		if status != tc.status || retryAfter != tc.retryAfter || goAway.ErrCode != http2.ErrCodeNo {
			t.Errorf("%s: status %q Retry-After %q GOAWAY %v; want %s, %q and a graceful GOAWAY", tc.name, status, retryAfter, goAway.ErrCode, tc.status, tc.retryAfter)
		}
	}
	if got := counter(m, "overload.refuse_requests.refused"); got != 1 {
		t.Errorf("overload.refuse_requests.refused = %d, want 1", got)
	}
	m.SetOverload(OverloadState{})
	c := h2cClient(t)
	resp, _ := h2Do(t, c, newReq(t, "GET", "http://"+a+"/x", nil))
	if resp.StatusCode != 200 {
		t.Errorf("overload cleared: HTTP/2 status %d, want 200", resp.StatusCode)
	}
}
