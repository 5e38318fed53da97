// Command quic-go-h3server is quic-go's own HTTP/3 server (package
// http3) serving the files of a directory, for the side-by-side runs of
// scripts/quic-100k.sh (many light, long-lived connections).
//
//	quic-go-h3server -listen ADDR -www DIR [-duration D] [-idle-timeout 30s]
//
// It uses a self-signed ECDSA P-256 certificate made at start (the load
// generator does not verify certificates), prints a JSON line
// {"kind":"listening","stack":"quic-go-h3","addr":...}, and serves until
// -duration ends (0: until SIGINT or SIGTERM).
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"flag"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
)

func selfSigned() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
	}
	der, err := x509.CreateCertificate(rand.Reader, &tmpl, &tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "UDP address to listen on")
	www := flag.String("www", "", "directory to serve (required)")
	duration := flag.Duration("duration", 0, "serve this long (0: until SIGINT or SIGTERM)")
	idle := flag.Duration("idle-timeout", 30*time.Second, "close a connection idle this long")
	flag.Parse()
	if *www == "" || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: quic-go-h3server -listen ADDR -www DIR [-duration D] [-idle-timeout D]")
		os.Exit(2)
	}
	cert, err := selfSigned()
	if err != nil {
		fmt.Fprintln(os.Stderr, "quic-go-h3server: certificate:", err)
		os.Exit(1)
	}
	udp, err := net.ListenPacket("udp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "quic-go-h3server:", err)
		os.Exit(1)
	}
	srv := &http3.Server{
		Handler:    http.FileServer(http.Dir(*www)),
		TLSConfig:  http3.ConfigureTLSConfig(&tls.Config{Certificates: []tls.Certificate{cert}}),
		QUICConfig: &quic.Config{MaxIdleTimeout: *idle},
	}
	_ = json.NewEncoder(os.Stdout).Encode(map[string]any{
		"kind": "listening", "stack": "quic-go-h3", "addr": udp.LocalAddr().String(),
	})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.Serve(udp); err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "quic-go-h3server:", err)
		os.Exit(1)
	}
}
