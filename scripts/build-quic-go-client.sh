#!/usr/bin/env bash
# Builds tools/quic-go-client (quic-go's HTTP/3 and hq-interop clients,
# pinned in its go.mod) into target/quic-go-client, and quic-go's interop
# client into target/quic-go-client-interop, for the tests that
# point an independent QUIC implementation at `fastudp quic serve`
# (crates/fastudp-cli/tests/it/quic_clients.rs), and its file-serving load
# client and reference servers (tools/quic-go-client/filebench) into
# target/quic-go-filebench, for scripts/bench-files.sh, and its hq-interop
# server of `quic serve`'s /bytes and /video (tools/quic-go-client/hqserver)
# into target/quic-go-hqserver, for scripts/quic-bench.sh, and quic-go's
# own HTTP/3 file server (tools/quic-go-client/h3server) into
# target/quic-go-h3server, for scripts/quic-100k.sh.
#
# quic-go v0.65 needs Go 1.26 or later (the `go` line of its go.mod).
# A Go in PATH or /usr/local/go is used; with none and as root, Debian's
# golang-go is installed, and the build fails with a clear message if
# that is older than go.mod asks (Debian 12 ships 1.19). Modules come
# from the Go module proxy; the build cache makes a second run take about
# a second.
#
#   scripts/build-quic-go-client.sh [OUT]     (default OUT: target/quic-go-client)
set -euo pipefail
cd "$(dirname "$0")/.."
src=tools/quic-go-client
out=${1:-${CARGO_TARGET_DIR:-target}/quic-go-client}
case $out in /*) ;; *) out=$PWD/$out ;; esac

go=$(command -v go || true)
if [ -z "$go" ] && [ -x /usr/local/go/bin/go ]; then
  go=/usr/local/go/bin/go
fi
if [ -z "$go" ]; then
  if [ "$(id -u)" = 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq golang-go
    go=$(command -v go)
  else
    echo "build-quic-go-client: no Go toolchain (go) and not root to install one" >&2
    exit 1
  fi
fi

need=$(awk '$1 == "go" { print $2; exit }' "$src/go.mod")
have=$("$go" env GOVERSION | sed 's/^go//')
# Version order: the lowest of the two is `need` when `have` is enough.
if [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -n1)" != "$need" ]; then
  echo "build-quic-go-client: $go is Go $have; $src/go.mod (quic-go) needs Go $need or later" >&2
  exit 1
fi

mkdir -p "$(dirname "$out")"
export GOPROXY=${GOPROXY:-https://proxy.golang.org} GOFLAGS=-mod=readonly
# Each binary is built to a file of its own and renamed into place, so
# that runs at once (test binaries of one `cargo test`) do not clash.
tmp=$(mktemp "$out.XXXXXX")
(cd "$src" && "$go" build -trimpath -o "$tmp" .)
mv "$tmp" "$out"
echo "$out"
# quic-go's own interop-runner client (TESTCASE=handshake, transfer,
# retry, resumption, zerortt, chacha20, keyupdate, multiplexing, http3),
# the `tool` of go.mod. Static, so that scripts/interop.sh can run it in
# a chroot whose /downloads and /logs are its own.
tmp=$(mktemp "$out-interop.XXXXXX")
(cd "$src" && CGO_ENABLED=0 "$go" build -trimpath -o "$tmp" \
  github.com/quic-go/quic-go/interop/client)
mv "$tmp" "$out-interop"
echo "$out-interop"
# The file-serving benchmark's load client and quic-go/net/http servers.
tmp=$(mktemp "$out-filebench.XXXXXX")
(cd "$src" && "$go" build -trimpath -o "$tmp" ./filebench)
mv "$tmp" "$(dirname "$out")/quic-go-filebench"
echo "$(dirname "$out")/quic-go-filebench"
# The hq-interop server (quic serve's application) for scripts/quic-bench.sh.
tmp=$(mktemp "$out-hqserver.XXXXXX")
(cd "$src" && "$go" build -trimpath -o "$tmp" ./hqserver)
mv "$tmp" "$(dirname "$out")/quic-go-hqserver"
echo "$(dirname "$out")/quic-go-hqserver"
tmp=$(mktemp "$out-h3server.XXXXXX")
(cd "$src" && "$go" build -trimpath -o "$tmp" ./h3server)
mv "$tmp" "$(dirname "$out")/quic-go-h3server"
echo "$(dirname "$out")/quic-go-h3server"
