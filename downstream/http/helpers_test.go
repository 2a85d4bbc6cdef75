package httpfront

import "testing"

func TestIsGRPC(t *testing.T) {
	for ct, want := range map[string]bool{
		"application/grpc": true, "application/grpc+proto": true, "application/grpc;charset=utf-8": true,
		"application/grpc-web": false, "application/grpc-web+proto": false, "application/grpcx": false, "text/plain": false,
	} {
		if got := isGRPC(ct); got != want {
			t.Errorf("isGRPC(%q) = %v, want %v", ct, got, want)
		}
	}
	if isGRPC("") {
		t.Error("isGRPC(no content type) = true")
	}
}

func TestAppendUpgrade(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"h2c", ""},
		{"H2C", ""},
		{"h2", ""},
		{"h2c/1", ""},
		{"websocket", "Connection: upgrade\r\nUpgrade: websocket\r\n"},
		{"websocket, h2c", "Connection: upgrade\r\nUpgrade: websocket\r\n"},
		{"h2c,  websocket/13 ,echo", "Connection: upgrade\r\nUpgrade: websocket/13, echo\r\n"},
		{"", ""},
	} {
		if got := string(appendUpgrade(nil, []byte(tc.in))); got != tc.want {
			t.Errorf("appendUpgrade(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if got := forwardsUpgrade([]byte(tc.in)); got != (tc.want != "") {
			t.Errorf("forwardsUpgrade(%q) = %v", tc.in, got)
		}
	}
}

func TestCookieValue(t *testing.T) {
	for _, tt := range []struct{ header, name, want string }{
		{"session=abc", "session", "abc"},
		{"a=1; session=xyz; b=2", "session", "xyz"},
		{"mysession=no; session=yes", "session", "yes"},
		{"a=1", "session", ""},
	} {
		v, ok := cookieValue([]byte(tt.header), tt.name)
		if string(v) != tt.want || ok != (tt.want != "") {
			t.Errorf("cookieValue(%q, %q) = %q, %v", tt.header, tt.name, v, ok)
		}
	}
}
