// Command smugglecheck sends request-smuggling cases (internal/smuggle) to
// an HTTP/1.1 proxy in front of a capture backend it runs itself, and
// prints what the proxy answered and what reached the backend. It exits 1
// when the hidden request reached the backend in any case, or, with
// -strict, when any case was not refused the way hotproxy refuses it.
//
//	smugglecheck -proxy 127.0.0.1:8080 -backend 127.0.0.1:9000 [-strict] [-h2 127.0.0.1:8081]
//
// With -h2 it also sends the HTTP/2 cases (smuggle.H2Cases) to the proxy's
// cleartext HTTP/2 (prior knowledge) listener at that address.
//
// Start the backend first (-backend-only) when the proxy needs it to be
// up before it starts.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/hotproxy/hotproxy/internal/smuggle"
)

func main() {
	proxy := flag.String("proxy", "", "`address` of the proxy under test")
	backend := flag.String("backend", "127.0.0.1:0", "`address` the capture backend listens on (the proxy's upstream)")
	backendOnly := flag.Bool("backend-only", false, "only run the capture backend until interrupted")
	strict := flag.Bool("strict", false, "fail unless every case is refused with its status, one response, the connection closed, nothing forwarded")
	name := flag.String("name", "proxy", "what to call the proxy in the output")
	h2 := flag.String("h2", "", "`address` of the proxy's cleartext HTTP/2 (prior knowledge) listener; empty: no HTTP/2 cases")
	flag.Parse()

	b, err := smuggle.Listen(*backend)
	if err != nil {
		fmt.Fprintf(os.Stderr, "smugglecheck: capture backend on %s: %v\n", *backend, err)
		os.Exit(2)
	}
	defer b.Close()
	if *backendOnly {
		fmt.Println(b.Addr())
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
		<-sig
		return
	}
	if *proxy == "" {
		fmt.Fprintln(os.Stderr, "smugglecheck: -proxy is required")
		os.Exit(2)
	}
	smuggled, loose := 0, 0
	fmt.Printf("%-42s %-8s %-36s %s\n", *name+": case", "verdict", "answer", "reached the backend")
	for _, c := range smuggle.Cases() {
		r, err := smuggle.Run(*proxy, b, c)
		verdict := "strict"
		switch {
		case err != nil:
			verdict = "ERROR"
			r.Answer = err.Error()
			loose++
		case r.Smuggled():
			verdict = "SMUGGLED"
			smuggled++
		case !r.Strict():
			verdict = "lenient"
			loose++
		}
		reached := "nothing"
		if r.Reached != "" {
			first, _, _ := strings.Cut(r.Reached, "\r\n")
			reached = fmt.Sprintf("%d bytes (%.40q)", len(r.Reached), first)
		}
		fmt.Printf("%-42s %-8s %-36.36s %s\n", c.Name, verdict, r.Answer, reached)
	}
	fmt.Printf("%s: %d cases, %d smuggled, %d not strictly refused\n", *name, len(smuggle.Cases()), smuggled, loose)
	if *h2 != "" {
		s, l := runH2(*name, *h2, b)
		smuggled, loose = smuggled+s, loose+l
	}
	if smuggled > 0 || (*strict && loose > 0) {
		os.Exit(1)
	}
}

// runH2 sends the HTTP/2 cases and prints them as main does the others.
func runH2(name, addr string, b *smuggle.Backend) (smuggled, loose int) {
	fmt.Printf("\n%-42s %-8s %-36s %s\n", name+": HTTP/2 case", "verdict", "answer", "reached the backend")
	for _, c := range smuggle.H2Cases() {
		r, err := smuggle.RunH2(addr, b, c)
		verdict := "strict"
		switch {
		case err != nil:
			verdict = "ERROR"
			r.Answer = err.Error()
			loose++
		case r.Smuggled():
			verdict = "SMUGGLED"
			smuggled++
		case !r.Strict():
			verdict = "lenient"
			loose++
		}
		reached := "nothing"
		if r.Reached != "" {
			first, _, _ := strings.Cut(r.Reached, "\r\n")
			reached = fmt.Sprintf("%d bytes (%.40q)", len(r.Reached), first)
		}
		fmt.Printf("%-42s %-8s %-36.36s %s\n", c.Name, verdict, r.Answer, reached)
	}
	fmt.Printf("%s: %d HTTP/2 cases, %d smuggled, %d not strictly refused\n", name, len(smuggle.H2Cases()), smuggled, loose)
	return smuggled, loose
}
