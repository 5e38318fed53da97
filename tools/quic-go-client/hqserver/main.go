// Command quic-go-hqserver is quic-go serving the application of
// `fastudp quic serve` (crates/fastudp-quic/src/hq/wire.rs): HTTP/0.9 over
// QUIC (ALPN hq-interop), one request line `GET /PATH` per bidirectional
// stream, `/bytes/N` answered with N bytes of the same pattern (byte i is
// i mod 251) and `/video/RATE/SECONDS` with RATE bytes per second in
// frames every -interval, the first at once, SECONDS/interval of them
// (rounded, at least one) of RATE*interval bytes (rounded, at least one).
// `fastudp quic load` checks every byte it receives. It is the quic-go
// server of scripts/quic-bench.sh (BENCHMARKS section 17).
//
//	quic-go-hqserver -listen ADDR [-interval 40ms] [-duration D] [-idle-timeout 30s]
//
// It prints a JSON line {"kind":"listening",...}, serves until -duration
// ends (0: until SIGINT or SIGTERM), then prints a JSON summary with the
// fields scripts/quic-bench.sh reads from every server: seconds,
// goodput_gbit_s (response bytes of connections the client closed with
// code 0 after reading them, over the run), cpu_s_per_gbit and cpu_cores
// (the process's user and system CPU from listening to the end),
// retransmissions (packets the connections declared lost), and the
// TLS 1.3 cipher suite of every connection (crypto/tls does not let a
// TLS 1.3 server choose; it picks AES-128-GCM when the client offers it
// and the CPU has AES instructions, and `quic load` offers only
// TLS_AES_128_GCM_SHA256).
//
// Bounds: 16 concurrent request streams per connection, no unidirectional
// streams, request lines of at most 1024 bytes read within
// -request-timeout, -max-connections connections (more are refused by
// closing them at once); a refused request is reset with the codes of
// hq/wire.rs (0x10 bad request, 0x11 too long, 0x13 request timeout).
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/quic-go/quic-go"

	"fastudp/tools/quic-go-client/internal/selfsigned"
)

const (
	alpn        = "hq-interop"
	maxRequest  = 1024
	maxBytes    = 1 << 40
	period      = 251
	chunk       = 64 * 1024
	codeBad     = 0x10
	codeTooLong = 0x11
	codeTimeout = 0x13
	maxStreams  = 16
)

// pattern holds enough of the pattern to slice a chunk from any phase.
var pattern = func() []byte {
	p := make([]byte, chunk+period)
	for i := range p {
		p[i] = byte(i % period)
	}
	return p
}()

// request is a parsed request: n bytes, or rate bytes/s for seconds.
type request struct {
	video   bool
	n       uint64
	rate    uint64
	seconds uint64
}

var errTooLong = errors.New("request line too long")

// parse is hq::parse of a whole line (without its line end).
func parse(line string) (request, error) {
	bad := errors.New("bad request")
	if len(line) > maxRequest {
		return request{}, errTooLong
	}
	line = strings.TrimSuffix(line, "\r")
	path, ok := strings.CutPrefix(line, "GET ")
	if !ok {
		return request{}, bad
	}
	num := func(s string) (uint64, error) {
		if s == "" {
			return 0, bad
		}
		for _, c := range []byte(s) {
			if c < '0' || c > '9' {
				return 0, bad
			}
		}
		return strconv.ParseUint(s, 10, 64)
	}
	parts := strings.Split(path, "/")
	switch {
	case len(parts) == 3 && parts[0] == "" && parts[1] == "bytes":
		n, err := num(parts[2])
		if err != nil || n > maxBytes {
			return request{}, bad
		}
		return request{n: n}, nil
	case len(parts) == 4 && parts[0] == "" && parts[1] == "video":
		rate, err1 := num(parts[2])
		secs, err2 := num(parts[3])
		if err1 != nil || err2 != nil || rate == 0 || rate > 10_000_000_000 || secs > 86_400 {
			return request{}, bad
		}
		return request{video: true, rate: rate, seconds: secs}, nil
	}
	return request{}, bad
}

// frames is hq::Frames::new: (bytes per frame, number of frames).
func frames(rate, seconds uint64, interval time.Duration) (uint64, uint64) {
	count := math.Max(1, math.Round(float64(seconds)/interval.Seconds()))
	bytes := math.Max(1, math.Round(float64(rate)*interval.Seconds()))
	return uint64(bytes), uint64(count)
}

// readLine reads a request line: up to '\n', or to the stream's end.
func readLine(r io.Reader) (string, error) {
	var buf []byte
	var b [256]byte
	for {
		n, err := r.Read(b[:])
		buf = append(buf, b[:n]...)
		if i := strings.IndexByte(string(buf), '\n'); i >= 0 {
			if i > maxRequest {
				return "", errTooLong
			}
			return string(buf[:i]), nil
		}
		if len(buf) > maxRequest {
			return "", errTooLong
		}
		if errors.Is(err, io.EOF) {
			return string(buf), nil
		}
		if err != nil {
			return "", err
		}
	}
}

type counters struct {
	accepted, refused, open   atomic.Int64
	requests, badRequests     atomic.Int64
	written, goodput, retrans atomic.Int64
	mu                        sync.Mutex
	suites                    map[string]int
}

func (c *counters) suite(name string) {
	c.mu.Lock()
	c.suites[name]++
	c.mu.Unlock()
}

// write writes length bytes of the pattern from offset off.
func write(w io.Writer, off, length uint64, c *counters) (uint64, error) {
	end := off + length
	for off < end {
		n := min(end-off, chunk)
		at := off % period
		k, err := w.Write(pattern[at : at+n])
		c.written.Add(int64(k))
		off += uint64(k)
		if err != nil {
			return off, err
		}
	}
	return off, nil
}

// respond answers one request stream; the response's length when it was
// written whole.
func respond(str *quic.Stream, interval, reqTimeout time.Duration, c *counters) (uint64, bool) {
	_ = str.SetReadDeadline(time.Now().Add(reqTimeout))
	line, err := readLine(str)
	var req request
	if err == nil {
		req, err = parse(line)
	}
	if err != nil {
		code := quic.StreamErrorCode(codeBad)
		var ne interface{ Timeout() bool }
		switch {
		case errors.Is(err, errTooLong):
			code = codeTooLong
		case errors.As(err, &ne) && ne.Timeout():
			code = codeTimeout
		}
		c.badRequests.Add(1)
		str.CancelWrite(code)
		str.CancelRead(code)
		return 0, false
	}
	c.requests.Add(1)
	_ = str.SetReadDeadline(time.Time{})
	// The FIN after the line is read, as the other servers do; bytes past
	// the line are refused.
	go func() {
		var b [1]byte
		if n, _ := io.ReadFull(str, b[:]); n > 0 {
			str.CancelRead(0)
		}
	}()
	var total uint64
	if !req.video {
		if _, err := write(str, 0, req.n, c); err != nil {
			return 0, false
		}
		total = req.n
	} else {
		fb, count := frames(req.rate, req.seconds, interval)
		start := time.Now()
		var off uint64
		for k := uint64(0); k < count; k++ {
			if d := time.Until(start.Add(time.Duration(k) * interval)); d > 0 {
				time.Sleep(d)
			}
			if off, err = write(str, off, fb, c); err != nil {
				return 0, false
			}
		}
		total = fb * count
	}
	if str.Close() != nil {
		return 0, false
	}
	return total, true
}

// serveConn serves one connection's streams; its responses count as
// goodput when the client closes the connection with code 0 (it closes
// so once it has read every response whole).
func serveConn(conn *quic.Conn, interval, reqTimeout time.Duration, c *counters) {
	c.suite(tls.CipherSuiteName(conn.ConnectionState().TLS.CipherSuite))
	var delivered atomic.Int64
	var wg sync.WaitGroup
	for {
		str, err := conn.AcceptStream(context.Background())
		if err != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if n, ok := respond(str, interval, reqTimeout, c); ok {
				delivered.Add(int64(n))
			}
		}()
	}
	<-conn.Context().Done()
	wg.Wait()
	var ae *quic.ApplicationError
	if errors.As(context.Cause(conn.Context()), &ae) && ae.Remote && ae.ErrorCode == 0 {
		c.goodput.Add(delivered.Load())
	}
	c.retrans.Add(int64(conn.ConnectionStats().PacketsLost))
	c.open.Add(-1)
}

func usage(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "quic-go-hqserver: "+format+"\n", a...)
	os.Exit(2)
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime) + tv(ru.Stime)
}

func main() {
	listen := flag.String("listen", "127.0.0.1:4433", "UDP address to listen on")
	interval := flag.Duration("interval", 40*time.Millisecond, "time between the frames of a /video stream")
	duration := flag.Duration("duration", 0, "serve this long (0: until SIGINT or SIGTERM)")
	idle := flag.Duration("idle-timeout", 30*time.Second, "close a connection idle this long")
	reqTimeout := flag.Duration("request-timeout", 10*time.Second, "time a client has to send its request line")
	maxConns := flag.Int64("max-connections", 100_000, "connections at most; more are closed at once")
	flag.Parse()
	if flag.NArg() != 0 {
		usage("unexpected argument %q", flag.Arg(0))
	}
	if *interval < time.Millisecond || *idle <= 0 || *reqTimeout <= 0 || *maxConns < 1 || *duration < 0 {
		usage("-interval at least 1ms; -idle-timeout, -request-timeout and -max-connections positive")
	}
	cert, err := selfsigned.New()
	if err != nil {
		fmt.Fprintf(os.Stderr, "quic-go-hqserver: certificate: %v\n", err)
		os.Exit(1)
	}
	tlsConf := &tls.Config{
		Certificates: []tls.Certificate{cert},
		NextProtos:   []string{alpn},
		MinVersion:   tls.VersionTLS13,
	}
	qconf := &quic.Config{
		MaxIdleTimeout:        *idle,
		MaxIncomingStreams:    maxStreams,
		MaxIncomingUniStreams: -1,
	}
	ln, err := quic.ListenAddr(*listen, tlsConf, qconf)
	if err != nil {
		usage("-listen %s: %v", *listen, err)
	}
	enc := json.NewEncoder(os.Stdout)
	_ = enc.Encode(map[string]any{"kind": "listening", "stack": "quic-go", "addr": ln.Addr().String(), "alpn": alpn})
	c := &counters{suites: map[string]int{}}
	t0, cpu0 := time.Now(), cpuSeconds()
	go func() {
		for {
			conn, err := ln.Accept(context.Background())
			if err != nil {
				return
			}
			if c.open.Load() >= *maxConns {
				c.refused.Add(1)
				_ = conn.CloseWithError(0x14, "too many connections")
				continue
			}
			c.accepted.Add(1)
			c.open.Add(1)
			go serveConn(conn, *interval, *reqTimeout, c)
		}
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	var timer <-chan time.Time
	if *duration > 0 {
		timer = time.After(*duration)
	}
	select {
	case <-sig:
	case <-timer:
	}
	// Connections the clients are closing still count their goodput.
	for end := time.Now().Add(2 * time.Second); c.open.Load() > 0 && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
	secs, cpu := time.Since(t0).Seconds(), cpuSeconds()-cpu0
	_ = ln.Close()
	gbit := float64(c.goodput.Load()) * 8 / 1e9
	var perGbit any
	if gbit > 1e-3 {
		perGbit = cpu / gbit
	}
	c.mu.Lock()
	suites := c.suites
	c.mu.Unlock()
	_ = enc.Encode(map[string]any{
		"kind":            "summary",
		"stack":           "quic-go",
		"seconds":         secs,
		"accepted":        c.accepted.Load(),
		"refused":         c.refused.Load(),
		"connections":     c.open.Load(),
		"requests":        c.requests.Load(),
		"bad_requests":    c.badRequests.Load(),
		"goodput_bytes":   c.goodput.Load(),
		"goodput_gbit_s":  gbit / secs,
		"wire_gbit_s":     float64(c.written.Load()) * 8 / 1e9 / secs,
		"cpu_s_per_gbit":  perGbit,
		"cpu_cores":       cpu / secs,
		"retransmissions": c.retrans.Load(),
		"cipher_suites":   suites,
	})
}
