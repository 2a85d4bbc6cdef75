package h2

import (
	"bufio"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// FuzzClientResponse feeds arbitrary bytes as everything a server says
// after its SETTINGS, once our request is out: the client must neither
// panic nor hang, must never hand a malformed head to the caller, and
// must bound what it buffers.
func FuzzClientResponse(f *testing.F) {
	var ok []byte
	ok = clientAppendFrameHeader(ok, 1, http2.FrameHeaders, http2.FlagHeadersEndHeaders, 1)
	ok = append(ok, 0x88)
	ok = clientAppendData(ok, 1, true, []byte("hello"))
	f.Add(ok)
	f.Add(clientAppendGoAway(nil, 0, http2.ErrCodeNo))
	f.Add(clientAppendWindowUpdate(nil, 0, 1<<31-1))
	f.Add(clientAppendRSTStream(nil, 1, http2.ErrCodeRefusedStream))
	cont := clientAppendFrameHeader(nil, 1, http2.FrameHeaders, 0, 1)
	cont = append(cont, 0x88)
	cont = clientAppendFrameHeader(cont, 0, http2.FrameContinuation, 0, 1)
	f.Add(cont)
	f.Add([]byte{0, 0, 3, 1, 5, 0, 0, 0, 1, 0x48, 0x01, '9'}) // :status literal "9"
	f.Fuzz(func(t *testing.T, peer []byte) {
		cli, srv := net.Pipe()
		defer cli.Close()
		go func() {
			defer srv.Close()
			br := bufio.NewReader(srv)
			if _, err := br.Discard(len(clientPreface)); err != nil {
				return
			}
			var hdr [9]byte
			for { // until our request's HEADERS
				if _, err := io.ReadFull(br, hdr[:]); err != nil {
					return
				}
				if _, err := br.Discard(int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])); err != nil {
					return
				}
				if http2.FrameType(hdr[3]) == http2.FrameHeaders {
					break
				}
			}
			go io.Copy(io.Discard, br)
			srv.Write(append(clientAppendSettings(nil, nil), peer...))
		}()
		cc, err := NewClientConn(cli, &ClientConfig{StreamWindow: 65535, ConnWindow: 65535, MaxHeaderListSize: 4096})
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		s, err := cc.OpenStream(clientGET)
		if err != nil {
			return
		}
		defer s.Release()
		got := make(chan struct{})
		go func() {
			defer close(got)
			status, fields, err := s.ResponseHead()
			if err != nil {
				return
			}
			if status < 200 || status > 599 {
				t.Errorf("final status %d", status)
			}
			head := append([]hpack.HeaderField{{Name: ":status", Value: strconv.Itoa(status)}}, fields...)
			if _, _, kind, err := clientCheckResponseHead(head); err != nil || kind != clientHeadFinal {
				t.Errorf("a head that does not validate reached the caller: %v", err)
			}
			n, _ := io.Copy(io.Discard, s)
			if n > int64(len(peer)) {
				t.Errorf("read %d body bytes from %d peer bytes", n, len(peer))
			}
		}()
		select {
		case <-got:
		case <-time.After(10 * time.Second):
			t.Fatal("stream neither ended nor failed after the peer closed")
		}
	})
}
