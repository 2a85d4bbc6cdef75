package h2

import (
	"bufio"
	"testing"

	"golang.org/x/net/http2"
)

// Frames that provoke no reply (PRIORITY, WINDOW_UPDATE, unknown types)
// are never bounded by MaxQueuedControlFrames: only the control budget
// stops a flood of them.
func TestNoRequestFrameFloodsGoAway(t *testing.T) {
	floods := []struct {
		name string
		send func(fr *http2.Framer, i int) error
	}{
		{"PRIORITY", func(fr *http2.Framer, i int) error {
			return fr.WritePriority(uint32(2*i+1), http2.PriorityParam{Weight: 15})
		}},
		{"WINDOW_UPDATE", func(fr *http2.Framer, i int) error { return fr.WriteWindowUpdate(0, 1) }},
		{"unknown", func(fr *http2.Framer, i int) error { return fr.WriteRawFrame(0xfa, 0, 0, nil) }},
	}
	for _, fl := range floods {
		t.Run(fl.name, func(t *testing.T) {
			floodTest(t, &ServerConfig{}, http2.ErrCodeEnhanceYourCalm, "control-rate", func(rc *rawClient, bw *bufio.Writer, fr *http2.Framer) {
				for i := 0; i < 200000; i++ {
					fl.send(fr, i)
					if i%256 == 0 && !writeOrStop(bw.Flush()) {
						return
					}
				}
			})
		})
	}
}
