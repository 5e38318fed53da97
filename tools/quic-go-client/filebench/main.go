// Command quic-go-filebench is both ends of the file-serving comparison of
// docs/BENCHMARKS.md (scripts/bench-files.sh): a load client that fetches
// files over HTTP/3 (quic-go's http3) or over TLS on TCP (Go's net/http,
// HTTP/1.1 or HTTP/2) from one program, so every server meets the same
// client; and two reference servers, quic-go's http3 server and Go's
// net/http over TLS, both serving a directory with http.FileServer.
//
//	quic-go-filebench load -proto h3|https [-h2] -dir DIR [-verify]
//	    [-connections N] [-duration D] [-count N] [-post BYTES] [-insecure]
//	    https://HOST:PORT
//	quic-go-filebench serve -proto h3|https -listen ADDR -www DIR [-duration D]
//
// load opens N connections; each fetches the files of DIR (the names and
// sizes of the regular files in it, as the server sees them) one after
// the other in a loop, starting at a different file, until -duration
// ends, and counts the body bytes it reads. A response is an error if its
// status is not 200 or its length is not the file's (with -verify: if a
// byte differs from DIR's copy). A response still in flight when the time
// is up is cut off: its bytes count, it is neither completed nor an
// error. With -count, the run also ends once N requests have started (in
// all). With -post BYTES, every request is instead a POST of a BYTES-byte
// body (a repeating byte pattern, with its content-length) to /NAME, whose
// bytes count as they are sent; the answer must be 200 and start with the
// body's length in decimal and a space, the `LEN HEX` of the axum
// example's POST /upload (crates/fastudp-quic/examples/axum.rs), so a body
// the server did not read whole is an error. The JSON line also gives
// the completed requests' latency (p50_ms, p99_ms, max_ms: from sending
// the request to reading the whole answer). It prints one JSON line and
// exits 1 if there was an error or no response completed, 2 on bad
// arguments.
//
// serve prints "listening ADDR" and serves until -duration ends (0: until
// SIGINT or SIGTERM), then prints one JSON line with its request count.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"

	"fastudp/tools/quic-go-client/internal/selfsigned"
)

func usage(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "quic-go-filebench: "+format+"\n", a...)
	os.Exit(2)
}

func main() {
	if len(os.Args) < 2 {
		usage("usage: quic-go-filebench load|serve [FLAGS]")
	}
	switch os.Args[1] {
	case "load":
		os.Exit(load(os.Args[2:]))
	case "serve":
		os.Exit(serve(os.Args[2:]))
	default:
		usage("%q: load or serve", os.Args[1])
	}
}

// file is one file of the directory the load fetches.
type file struct {
	name string
	size int64
}

// listFiles is the regular files of dir, sorted by name.
func listFiles(dir string) ([]file, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var fs []file
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		info, err := e.Info()
		if err != nil {
			return nil, err
		}
		fs = append(fs, file{e.Name(), info.Size()})
	}
	if len(fs) == 0 {
		return nil, fmt.Errorf("no regular file in %s", dir)
	}
	sort.Slice(fs, func(i, j int) bool { return fs[i].name < fs[j].name })
	return fs, nil
}

// counters of a load run, shared by its connections.
type counters struct {
	bytes     atomic.Int64
	requests  atomic.Int64
	completed atomic.Int64
	errors    atomic.Int64
	firstErr  atomic.Value
}

func (c *counters) fail(err error) {
	c.errors.Add(1)
	c.firstErr.CompareAndSwap(nil, err.Error())
}

func load(args []string) int {
	fl := flag.NewFlagSet("load", flag.ExitOnError)
	proto := fl.String("proto", "h3", "h3 (quic-go http3) or https (net/http over TLS on TCP)")
	h2 := fl.Bool("h2", false, "with -proto https: HTTP/2 (default HTTP/1.1)")
	dir := fl.String("dir", "", "the directory the server serves (names and sizes of its files)")
	verify := fl.Bool("verify", false, "compare every body byte with DIR's copy")
	conns := fl.Int("connections", 10, "connections, each fetching one file at a time")
	duration := fl.Duration("duration", 10*time.Second, "how long to fetch")
	insecure := fl.Bool("insecure", false, "do not verify the server's certificate")
	count := fl.Int64("count", 0, "end once this many requests have started, in all (0: no bound)")
	post := fl.Int64("post", -1, "POST a body of this many bytes to each /NAME, instead of GET")
	_ = fl.Parse(args)
	if fl.NArg() != 1 {
		usage("load: one base URL (https://HOST:PORT) expected")
	}
	base := fl.Arg(0)
	if *dir == "" {
		usage("load: -dir is required")
	}
	if *conns < 1 || *duration <= 0 {
		usage("load: -connections and -duration must be positive")
	}
	if *count < 0 {
		usage("load: -count must be 0 (no bound) or positive")
	}
	if *post >= 0 && *verify {
		usage("load: -verify goes with GETs, not -post")
	}
	if *proto != "h3" && *proto != "https" {
		usage("load: -proto %q: h3 or https", *proto)
	}
	if *h2 && *proto != "https" {
		usage("load: -h2 goes with -proto https")
	}
	files, err := listFiles(*dir)
	if err != nil {
		usage("load: -dir: %v", err)
	}
	log.SetOutput(io.Discard)
	tlsConf := &tls.Config{InsecureSkipVerify: *insecure}

	// One transport per connection, each allowed one connection.
	clients := make([]*http.Client, *conns)
	closers := make([]io.Closer, 0, *conns)
	for i := range clients {
		var rt http.RoundTripper
		if *proto == "h3" {
			t := &http3.Transport{
				TLSClientConfig: tlsConf.Clone(),
				QUICConfig:      &quic.Config{MaxIdleTimeout: 30 * time.Second},
			}
			closers = append(closers, t)
			rt = t
		} else {
			t := &http.Transport{
				TLSClientConfig:     tlsConf.Clone(),
				MaxConnsPerHost:     1,
				MaxIdleConnsPerHost: 1,
				DisableCompression:  true,
				ForceAttemptHTTP2:   *h2,
			}
			if !*h2 {
				// A non-nil empty map turns HTTP/2 off.
				t.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
			}
			rt = t
		}
		clients[i] = &http.Client{Transport: rt}
	}

	var c counters
	var cpu0 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &cpu0)
	start := time.Now()
	ctx, cancel := context.WithDeadline(context.Background(), start.Add(*duration))
	defer cancel()
	var wg sync.WaitGroup
	lat := make([][]time.Duration, len(clients))
	for i, cl := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 64*1024)
			for k := i; ctx.Err() == nil; k++ {
				f := files[k%len(files)]
				if n := c.requests.Add(1); *count > 0 && n > *count {
					c.requests.Add(-1)
					return
				}
				t0 := time.Now()
				var err error
				if *post >= 0 {
					err = upload(ctx, cl, base+"/"+f.name, *post, buf, &c)
				} else {
					err = fetch(ctx, cl, base+"/"+f.name, f, *dir, *verify, buf, &c)
				}
				switch {
				case err == nil:
					lat[i] = append(lat[i], time.Since(t0))
					c.completed.Add(1)
				case ctx.Err() != nil:
					// Cut off at the end of the run.
				default:
					c.fail(err)
					time.Sleep(10 * time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	var cpu1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &cpu1)
	for _, cl := range closers {
		_ = cl.Close()
	}
	proto_ := *proto
	if *proto == "https" {
		proto_ = "https/1.1"
		if *h2 {
			proto_ = "https/2"
		}
	}
	n := c.bytes.Load()
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	q := func(p float64) float64 {
		if len(all) == 0 {
			return 0
		}
		i := int(float64(len(all)) * p)
		if i >= len(all) {
			i = len(all) - 1
		}
		return float64(all[i].Microseconds()) / 1000
	}
	out := map[string]any{
		"kind":         "load",
		"proto":        proto_,
		"connections":  *conns,
		"seconds":      secs,
		"bytes":        n,
		"goodput_gbit": float64(n) * 8 / secs / 1e9,
		"requests":     c.requests.Load(),
		"completed":    c.completed.Load(),
		"errors":       c.errors.Load(),
		"verified":     *verify,
		"client_cpu_s": tv(cpu1.Utime) + tv(cpu1.Stime) - tv(cpu0.Utime) - tv(cpu0.Stime),
		"p50_ms":       q(0.50),
		"p99_ms":       q(0.99),
		"max_ms":       q(1),
	}
	if *post >= 0 {
		out["post_bytes"] = *post
	}
	if e := c.firstErr.Load(); e != nil {
		out["first_error"] = e
	}
	_ = json.NewEncoder(os.Stdout).Encode(out)
	if c.errors.Load() > 0 || c.completed.Load() == 0 {
		return 1
	}
	return 0
}

func tv(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }

// fetch GETs url and checks the body against f; adds the bytes it reads
// to c as they arrive.
func fetch(ctx context.Context, cl *http.Client, url string, f file, dir string, verify bool, buf []byte, c *counters) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	rsp, err := cl.Do(req)
	if err != nil {
		return err
	}
	defer rsp.Body.Close()
	if rsp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, rsp.Body)
		return fmt.Errorf("%s: status %d", url, rsp.StatusCode)
	}
	if rsp.ContentLength >= 0 && rsp.ContentLength != f.size {
		return fmt.Errorf("%s: Content-Length %d, file has %d", url, rsp.ContentLength, f.size)
	}
	var local *os.File
	var want []byte
	if verify {
		local, err = os.Open(filepath.Join(dir, f.name))
		if err != nil {
			return err
		}
		defer local.Close()
		want = make([]byte, len(buf))
	}
	var got int64
	for {
		n, err := rsp.Body.Read(buf)
		if n > 0 {
			c.bytes.Add(int64(n))
			if verify {
				if _, err := io.ReadFull(local, want[:n]); err != nil {
					return fmt.Errorf("%s: body longer than the file (%d bytes at least)", url, got+int64(n))
				}
				if !bytes.Equal(buf[:n], want[:n]) {
					return fmt.Errorf("%s: body differs from the file in bytes %d..%d", url, got, got+int64(n))
				}
			}
			got += int64(n)
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
	}
	if got != f.size {
		return fmt.Errorf("%s: %d body bytes, file has %d", url, got, f.size)
	}
	return nil
}

func serve(args []string) int {
	fl := flag.NewFlagSet("serve", flag.ExitOnError)
	proto := fl.String("proto", "h3", "h3 (quic-go http3) or https (net/http over TLS on TCP: HTTP/1.1 and HTTP/2)")
	listen := fl.String("listen", "127.0.0.1:4433", "address to listen on")
	www := fl.String("www", "", "directory to serve")
	duration := fl.Duration("duration", 0, "serve this long (0: until SIGINT or SIGTERM)")
	_ = fl.Parse(args)
	if *www == "" {
		usage("serve: -www is required")
	}
	if st, err := os.Stat(*www); err != nil || !st.IsDir() {
		usage("serve: -www %s: not a directory", *www)
	}
	if *proto != "h3" && *proto != "https" {
		usage("serve: -proto %q: h3 or https", *proto)
	}
	cert, err := selfsigned.New()
	if err != nil {
		fmt.Fprintf(os.Stderr, "quic-go-filebench: certificate: %v\n", err)
		return 1
	}
	var requests atomic.Int64
	fs := http.FileServer(http.Dir(*www))
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		fs.ServeHTTP(w, r)
	})
	tlsConf := &tls.Config{Certificates: []tls.Certificate{cert}}
	log.SetOutput(io.Discard)

	var stop func()
	errc := make(chan error, 1)
	if *proto == "h3" {
		addr, err := net.ResolveUDPAddr("udp", *listen)
		if err != nil {
			usage("serve: -listen %s: %v", *listen, err)
		}
		pc, err := net.ListenUDP("udp", addr)
		if err != nil {
			usage("serve: -listen %s: %v", *listen, err)
		}
		s := &http3.Server{Handler: h, TLSConfig: http3.ConfigureTLSConfig(tlsConf), QUICConfig: &quic.Config{MaxIdleTimeout: 30 * time.Second}}
		fmt.Printf("listening %s (h3)\n", pc.LocalAddr())
		go func() { errc <- s.Serve(pc) }()
		stop = func() { _ = s.Close() }
	} else {
		ln, err := net.Listen("tcp", *listen)
		if err != nil {
			usage("serve: -listen %s: %v", *listen, err)
		}
		s := &http.Server{Handler: h, TLSConfig: tlsConf, ErrorLog: log.New(io.Discard, "", 0)}
		fmt.Printf("listening %s (https)\n", ln.Addr())
		go func() { errc <- s.ServeTLS(ln, "", "") }()
		stop = func() { _ = s.Close() }
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	var timer <-chan time.Time
	if *duration > 0 {
		timer = time.After(*duration)
	}
	code := 0
	select {
	case <-sig:
	case <-timer:
	case err := <-errc:
		fmt.Fprintf(os.Stderr, "quic-go-filebench: serve: %v\n", err)
		code = 1
	}
	stop()
	_ = json.NewEncoder(os.Stdout).Encode(map[string]any{"kind": "served", "proto": *proto, "requests": requests.Load()})
	return code
}

// pattern is a request body of n bytes, a repeating byte pattern, that
// adds the bytes the transport reads to c.
type pattern struct {
	left int64
	off  int64
	c    *counters
}

func (p *pattern) Read(b []byte) (int, error) {
	if p.left == 0 {
		return 0, io.EOF
	}
	if int64(len(b)) > p.left {
		b = b[:p.left]
	}
	for i := range b {
		b[i] = byte((p.off + int64(i)) % 251)
	}
	p.left -= int64(len(b))
	p.off += int64(len(b))
	p.c.bytes.Add(int64(len(b)))
	return len(b), nil
}

// upload POSTs n bytes to url; the answer must be 200 and start with n in
// decimal and a space (the length the server read).
func upload(ctx context.Context, cl *http.Client, url string, n int64, buf []byte, c *counters) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, &pattern{left: n, c: c})
	if err != nil {
		return err
	}
	req.ContentLength = n
	rsp, err := cl.Do(req)
	if err != nil {
		return err
	}
	defer rsp.Body.Close()
	got, err := io.ReadAll(io.LimitReader(rsp.Body, int64(len(buf))))
	if err != nil {
		return err
	}
	if rsp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: status %d", url, rsp.StatusCode)
	}
	want := strconv.FormatInt(n, 10) + " "
	if !bytes.HasPrefix(got, []byte(want)) {
		return fmt.Errorf("%s: the answer %.40q does not start with the body's length %d", url, got, n)
	}
	return nil
}
