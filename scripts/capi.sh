#!/usr/bin/env bash
# libfastudp for C: build, install, check. This does what cargo-c's
# `cargo cinstall` would, with nothing to install first (cargo-c takes
# 10 minutes to build on a 2-CPU machine, a ninth of CI's budget).
#
#   scripts/capi.sh install [--prefix DIR] [--libdir DIR] [--destdir DIR]
#       cargo build --release -p fastudp-ffi, then installs
#         PREFIX/include/fastudp.h            (the checked-in header)
#         LIBDIR/libfastudp.so.0.1.0          (soname libfastudp.so.0.1)
#         LIBDIR/libfastudp.so.0.1, libfastudp.so  (links)
#         LIBDIR/libfastudp.a
#         LIBDIR/pkgconfig/fastudp.pc        (static linking: docs/C.md)
#       PREFIX defaults to /usr/local, LIBDIR to PREFIX/lib; DESTDIR is
#       prepended to every path written (for packaging), not to the .pc's.
#
#   scripts/capi.sh check [--prefix DIR]
#       What CI runs: installs into DIR (default: a temporary directory),
#       builds examples/c with `pkg-config --cflags --libs fastudp`
#       (`make -C examples/c`), has them exchange 100,000 checked
#       datagrams, and runs the C API tests and the exchange under valgrind
#       against the installed release library: any valgrind error fails.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
major=${version%%.*}
rest=${version#*.}
minor=${rest%%.*}
if [ "$major" = 0 ]; then soversion="$major.$minor"; else soversion="$major"; fi

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
}

install_lib() {
    local prefix=/usr/local libdir="" destdir=""
    while [ $# -gt 0 ]; do
        case "$1" in
        --prefix) prefix=$2; shift 2 ;;
        --libdir) libdir=$2; shift 2 ;;
        --destdir) destdir=$2; shift 2 ;;
        *) echo "capi.sh install: unknown option $1" >&2; usage ;;
        esac
    done
    case "$prefix" in /*) ;; *) echo "capi.sh: --prefix must be absolute: $prefix" >&2; exit 2 ;; esac
    libdir=${libdir:-$prefix/lib}
    local target=${CARGO_TARGET_DIR:-$repo/target}
    # The libraries the static library needs, as rustc prints them.
    local log
    log=$(mktemp)
    cargo rustc --release -p fastudp-ffi --lib --crate-type staticlib --crate-type cdylib \
        -- --print native-static-libs 2>&1 | tee "$log" | grep -v '^note: \(native-static-libs\|link against\)' >&2
    local private
    private=$(sed -n 's/^note: native-static-libs: //p' "$log" | tail -1)
    rm -f "$log"
    if [ -z "$private" ]; then
        # cargo did not rerun rustc (nothing changed): the list for the
        # standard library on Linux.
        private="-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc"
    fi
    # `pkg-config --static` serves `cc -static`, where libgcc_s (a shared
    # library only) cannot be linked: the static unwinder libgcc_eh takes
    # its place there. `static_libs` links libfastudp.a into a program
    # whose C library stays shared, with rustc's own list.
    local private_static=${private//-lgcc_s/-lgcc_eh}
    local rel=$target/release
    install -d "$destdir$prefix/include" "$destdir$libdir/pkgconfig"
    install -m 0644 include/fastudp.h "$destdir$prefix/include/fastudp.h"
    install -m 0755 "$rel/libfastudp_ffi.so" "$destdir$libdir/libfastudp.so.$version"
    ln -sf "libfastudp.so.$version" "$destdir$libdir/libfastudp.so.$soversion"
    ln -sf "libfastudp.so.$soversion" "$destdir$libdir/libfastudp.so"
    install -m 0644 "$rel/libfastudp_ffi.a" "$destdir$libdir/libfastudp.a"
    cat >"$destdir$libdir/pkgconfig/fastudp.pc" <<EOF
prefix=$prefix
exec_prefix=\${prefix}
libdir=$libdir
includedir=\${prefix}/include
static_libs=\${libdir}/libfastudp.a $private

Name: fastudp
Description: Batched UDP for Linux: GSO, GRO, sendmmsg/recvmmsg, run-time fallbacks (C ABI)
Version: $version
Libs: -L\${libdir} -lfastudp
Libs.private: $private_static
Cflags: -I\${includedir}
EOF
    echo "installed libfastudp $version in $destdir$prefix (pkg-config: $libdir/pkgconfig)"
}

check() {
    local prefix=""
    while [ $# -gt 0 ]; do
        case "$1" in
        --prefix) prefix=$2; shift 2 ;;
        *) echo "capi.sh check: unknown option $1" >&2; usage ;;
        esac
    done
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    prefix=${prefix:-$tmp/prefix}
    install_lib --prefix "$prefix"
    export PKG_CONFIG_PATH="$prefix/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
    echo "pkg-config --cflags --libs fastudp: $(pkg-config --cflags --libs fastudp)"
    make -C examples/c clean all check
    # The C API tests against the installed (release) library. The panic
    # hook is not in a release library; tests/it/c.rs covers it.
    local api=$tmp/api_test
    # shellcheck disable=SC2046
    cc -std=c11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Werror -o "$api" \
        crates/fastudp-ffi/tests/c/api_test.c $(pkg-config --cflags --libs fastudp) \
        -Wl,-rpath,"$(pkg-config --variable=libdir fastudp)"
    # grep reads all of ldd's output: `grep -q` would leave at the first
    # match, and a SIGPIPE to ldd fails the pipe under pipefail.
    if ldd "$api" | grep "libfastudp.so.$soversion => $prefix" >/dev/null; then
        echo "api_test uses $prefix/lib/libfastudp.so.$soversion"
    else
        echo "capi.sh: api_test does not load the installed library:" >&2
        ldd "$api" >&2
        exit 1
    fi
    local vg=(valgrind -q --error-exitcode=86 --leak-check=full --errors-for-leak-kinds=definite)
    "$api"
    "${vg[@]}" "$api"
    make -C examples/c check WRAP="${vg[*]}" DATAGRAMS=100000
    echo "capi.sh check: passed"
}

case "${1:-}" in
install) shift; install_lib "$@" ;;
check) shift; check "$@" ;;
*) usage ;;
esac
