#!/usr/bin/env bash
# Installs what the tests use, on Debian (12) as root; elsewhere it says
# what is missing. One command, named in the README's Install:
#
#   scripts/install-test-deps.sh
#
# Without these the tests that need them skip (and say why; scripts/test.sh
# counts them), or fail under FASTUDP_REQUIRE_PRIVILEGED_TESTS=1 (CI):
#   - root, iproute2 (ip), ethtool: the namespace tests;
#   - gcc/libc6-dev, make, pkg-config, valgrind: the C ABI's tests;
#   - g++: the fuzz targets (libFuzzer);
#   - chromium: the browser test of `quic serve`;
#   - openssl, nftables: certificate formats, loss for the interop cases;
#   - cmake: aws-lc-rs where its pre-generated build does not apply;
#   - python3 aioquic 1.7.2 (pip): the QUIC interop tests;
#   - Go: the quic-go clients (tools/quic-go-client), built into target/.
# About 2 min on a fresh Debian 12 (most of it chromium and Go modules).
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v ethtool >/dev/null 2>&1 || need+=(ethtool)
# The C ABI's tests (crates/fastudp-ffi/tests/it/c.rs, scripts/capi.sh check):
# a C compiler (also cargo's linker), make, pkg-config, valgrind. About 10 s
# to fetch and install on Debian 12 when missing.
command -v cc >/dev/null 2>&1 || need+=(gcc libc6-dev)
command -v make >/dev/null 2>&1 || need+=(make)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
command -v valgrind >/dev/null 2>&1 || need+=(valgrind)
# libfuzzer-sys compiles libFuzzer (C++) for the fuzz targets.
command -v c++ >/dev/null 2>&1 || need+=(g++)
# Headless Chromium loads pages from `fastudp quic serve` over HTTP/3
# (crates/fastudp-cli/tests/it/quic_clients.rs). About 1 min when missing.
command -v chromium >/dev/null 2>&1 || need+=(chromium)
# openssl makes the RSA, SEC1 and PKCS#1 keys of the certificate tests;
# nft drops datagrams at random for the interop loss cases (no netem here).
command -v openssl >/dev/null 2>&1 || need+=(openssl)
# curl: the axum example's TLS/TCP test (HTTP/1.1 and HTTP/2).
command -v curl >/dev/null 2>&1 || need+=(curl)
command -v nft >/dev/null 2>&1 || need+=(nftables)
# aws-lc-rs (`quic serve --crypto aws-lc-rs`) builds AWS-LC with the C
# compiler; it falls back to cmake where that does not work (sanitizer
# builds, targets without its pre-generated sources).
command -v cmake >/dev/null 2>&1 || need+=(cmake)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need[@]}"
  else
    echo "warning: ${need[*]} missing and not root: namespace tests will skip" >&2
  fi
fi

# The QUIC interop test (crates/fastudp-cli/tests/it/quic.rs) points aioquic,
# another QUIC implementation, at `fastudp quic serve`. About 10 s.
if ! python3 -c 'import aioquic' >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    if ! python3 -m pip --version >/dev/null 2>&1; then
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq
      apt-get install -y -qq python3-pip
    fi
    python3 -m pip install -q aioquic==1.7.2 2>/dev/null ||
      python3 -m pip install -q --break-system-packages aioquic==1.7.2
  else
    echo "warning: python3 aioquic missing and not root: the QUIC interop test will skip" >&2
  fi
fi

# quic-go's HTTP/3 and hq-interop clients (tools/quic-go-client, quic-go
# pinned in its go.mod), built into target/ for the same tests. About 1 min
# the first time (modules from the Go module proxy).
if [ "$(id -u)" = 0 ] || command -v go >/dev/null 2>&1; then
  scripts/build-quic-go-client.sh
else
  echo "warning: no Go toolchain and not root: the quic-go client tests will skip" >&2
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "warning: cargo not found; install a stable Rust toolchain (rustup)" >&2
fi
