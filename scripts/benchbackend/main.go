// Command benchbackend is the upstream that scripts/bench.sh measures
// hotproxy against: a minimal HTTP server with a fixed small answer, so
// the numbers are the proxy's, not the backend's.
package main

import (
	"flag"
	"log"
	"net/http"
	"strconv"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9000", "listen `address`")
	size := flag.Int("size", 64, "response body `bytes`")
	flag.Parse()
	body := make([]byte, *size)
	for i := range body {
		body[i] = 'a' + byte(i%26)
	}
	length := strconv.Itoa(len(body))
	log.Fatal(http.ListenAndServe(*addr, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Content-Length", length)
		w.Write(body)
	})))
}
