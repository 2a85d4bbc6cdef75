// Command tcpbulk pushes a bulk transfer through a TCP (L4) proxy, for
// scripts/bench-peers.sh, which measures the proxy's CPU time per GiB.
//
//	tcpbulk sink -addr 127.0.0.1:9100
//	tcpbulk send -addr 127.0.0.1:9111 -bytes 1073741824
//
// The sender announces the length in an 8-byte big-endian header, writes
// that many bytes, and waits for the sink to answer with the count it
// received, so a transfer counts as done only when every byte went through
// the proxy, and no proxy has to pass a half-close on for it to end.
package main

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"time"
)

// chunk is the size of each write and read: big enough that the syscall
// count is not what is measured.
const chunk = 256 << 10

func main() {
	if len(os.Args) < 2 || (os.Args[1] != "sink" && os.Args[1] != "send") {
		fmt.Fprintln(os.Stderr, "usage: tcpbulk sink -addr HOST:PORT | tcpbulk send -addr HOST:PORT -bytes N")
		os.Exit(2)
	}
	fs := flag.NewFlagSet("tcpbulk "+os.Args[1], flag.ExitOnError)
	addr := fs.String("addr", "", "`host:port`: where the sink listens, or where to send")
	size := fs.Int64("bytes", 1<<30, "bytes to send")
	timeout := fs.Duration("timeout", 5*time.Minute, "bound on the whole transfer")
	fs.Parse(os.Args[2:])
	if *addr == "" {
		fmt.Fprintln(os.Stderr, "tcpbulk: -addr is required")
		os.Exit(2)
	}
	var err error
	if os.Args[1] == "sink" {
		err = sink(*addr)
	} else {
		err = send(*addr, *size, *timeout)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "tcpbulk %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func sink(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			if err := drain(c); err != nil && !errors.Is(err, io.EOF) {
				// Readiness probes connect and close without a header.
				log.Printf("tcpbulk sink: %v", err)
			}
		}()
	}
}

// drain reads one transfer's header and body and answers with the count.
func drain(c net.Conn) error {
	var header [8]byte
	if _, err := io.ReadFull(c, header[:]); err != nil {
		return err
	}
	want := int64(binary.BigEndian.Uint64(header[:]))
	buf := make([]byte, chunk)
	got, err := io.CopyBuffer(io.Discard, io.LimitReader(c, want), buf)
	binary.BigEndian.PutUint64(header[:], uint64(got))
	if _, werr := c.Write(header[:]); err == nil {
		err = werr
	}
	return err
}

func send(addr string, size int64, timeout time.Duration) error {
	start := time.Now()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(start.Add(timeout))
	var header [8]byte
	binary.BigEndian.PutUint64(header[:], uint64(size))
	if _, err := c.Write(header[:]); err != nil {
		return err
	}
	buf := make([]byte, chunk)
	for left := size; left > 0; {
		n := min(left, chunk)
		if _, err := c.Write(buf[:n]); err != nil {
			return fmt.Errorf("after %d of %d bytes: %w", size-left, size, err)
		}
		left -= n
	}
	if _, err := io.ReadFull(c, header[:]); err != nil {
		return fmt.Errorf("waiting for the sink's count: %w", err)
	}
	if got := int64(binary.BigEndian.Uint64(header[:])); got != size {
		return fmt.Errorf("the sink received %d bytes, want %d", got, size)
	}
	secs := time.Since(start).Seconds()
	fmt.Printf("bytes=%d seconds=%.3f mib_per_s=%.1f\n", size, secs, float64(size)/(1<<20)/secs)
	return nil
}
