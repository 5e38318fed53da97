// Command quic-go-client fetches URLs over one QUIC connection with
// quic-go, a QUIC implementation independent of the server under test:
// HTTP/3 (quic-go's http3 package) or HTTP/0.9 over QUIC (hq-interop,
// quic-go's interop/http09 package). All URLs are requested in parallel.
// For each it prints one JSON line: the URL, the status, the length and
// the SHA-256 of the body. It exits 1 if any request fails or is not
// answered with 200, 2 on bad arguments.
//
//	quic-go-client [-alpn h3|hq-interop] [-insecure | -ca FILE] [-servername NAME] [-out DIR] URL...
package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
	"github.com/quic-go/quic-go/interop/http09"
)

type result struct {
	URL    string `json:"url"`
	Status int    `json:"status"`
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256,omitempty"`
	Error  string `json:"error,omitempty"`
}

func main() {
	alpn := flag.String("alpn", "h3", "application protocol: h3 or hq-interop")
	insecure := flag.Bool("insecure", false, "do not verify the server's certificate")
	ca := flag.String("ca", "", "PEM file of the certificate(s) to trust (instead of the system's)")
	serverName := flag.String("servername", "", "name to send (SNI) and verify (default: the URL's host)")
	out := flag.String("out", "", "directory to write each body to, named by the URL path's last element")
	timeout := flag.Duration("timeout", 60*time.Second, "give up after this long")
	flag.Parse()
	urls := flag.Args()
	if len(urls) == 0 {
		fmt.Fprintln(os.Stderr, "quic-go-client: no URL given")
		os.Exit(2)
	}
	if *insecure && *ca != "" {
		fmt.Fprintln(os.Stderr, "quic-go-client: -insecure and -ca exclude each other")
		os.Exit(2)
	}
	for _, u := range urls {
		p, err := url.Parse(u)
		if err != nil || p.Scheme != "https" || p.Host == "" {
			fmt.Fprintf(os.Stderr, "quic-go-client: %q is not an https:// URL\n", u)
			os.Exit(2)
		}
	}
	tlsConf := &tls.Config{InsecureSkipVerify: *insecure, ServerName: *serverName}
	if *ca != "" {
		pem, err := os.ReadFile(*ca)
		if err != nil {
			fmt.Fprintf(os.Stderr, "quic-go-client: -ca: %v\n", err)
			os.Exit(2)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			fmt.Fprintf(os.Stderr, "quic-go-client: -ca %s: no certificate in it\n", *ca)
			os.Exit(2)
		}
		tlsConf.RootCAs = pool
	}
	quicConf := &quic.Config{MaxIdleTimeout: 30 * time.Second}
	// quic-go's http09 package logs each request; the output here is the
	// JSON lines only.
	log.SetOutput(io.Discard)

	var dials atomic.Int32
	var rt http.RoundTripper
	switch *alpn {
	case "h3":
		rt = &http3.Transport{
			TLSClientConfig: tlsConf,
			QUICConfig:      quicConf,
			Dial: func(ctx context.Context, addr string, t *tls.Config, c *quic.Config) (*quic.Conn, error) {
				dials.Add(1)
				return quic.DialAddrEarly(ctx, addr, t, c)
			},
		}
	case "hq-interop":
		rt = &http09.RoundTripper{TLSClientConfig: tlsConf, QuicConfig: quicConf}
	default:
		fmt.Fprintf(os.Stderr, "quic-go-client: -alpn %q: h3 or hq-interop\n", *alpn)
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	results := make([]result, len(urls))
	var wg sync.WaitGroup
	for i, u := range urls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = fetch(ctx, rt, u, *out)
		}()
	}
	wg.Wait()
	failed := false
	enc := json.NewEncoder(os.Stdout)
	for _, r := range results {
		if r.Error != "" || r.Status != http.StatusOK {
			failed = true
		}
		_ = enc.Encode(r)
	}
	summary := map[string]any{"alpn": *alpn, "requests": len(urls)}
	if *alpn == "h3" {
		summary["connections"] = dials.Load()
	}
	_ = enc.Encode(summary)
	if c, ok := rt.(io.Closer); ok {
		_ = c.Close()
	}
	if failed {
		os.Exit(1)
	}
}

func fetch(ctx context.Context, rt http.RoundTripper, u, out string) result {
	r := result{URL: u}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	rsp, err := rt.RoundTrip(req)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	defer rsp.Body.Close()
	r.Status = rsp.StatusCode
	if rsp.ProtoMajor == 0 {
		// HTTP/0.9 has no status line: a complete body is its
		// success, set below.
		r.Status = 0
	}
	h := sha256.New()
	var w io.Writer = h
	if out != "" {
		name := path.Base(req.URL.Path)
		if name == "/" || name == "." {
			name = "index.html"
		}
		f, err := os.Create(filepath.Join(out, name))
		if err != nil {
			r.Error = err.Error()
			return r
		}
		defer f.Close()
		w = io.MultiWriter(h, f)
	}
	n, err := io.Copy(w, rsp.Body)
	r.Bytes = n
	if err != nil {
		r.Error = err.Error()
		return r
	}
	r.SHA256 = hex.EncodeToString(h.Sum(nil))
	if rsp.ProtoMajor == 0 {
		r.Status = http.StatusOK
	}
	return r
}
