#!/usr/bin/env bash
# The Debian package of fastudp (cargo-deb; [package.metadata.deb] in
# crates/fastudp-cli/Cargo.toml), and, with `install`, its installation
# and a check of the installed command:
#
#   scripts/deb.sh            build target/debian/fastudp_VERSION_ARCH.deb
#   scripts/deb.sh install    build it, `apt-get install` it (root), and run
#                             /usr/bin/fastudp --version, `man -w`,
#                             the bash completion and /usr/bin/fastudp doctor,
#                             and check the systemd unit (systemd-analyze
#                             verify where it exists; drain, reload, user)
#
# The package: /usr/bin/fastudp, a manual page per command
# (`fastudp man --dir`), bash, zsh and fish completions (`fastudp
# completions`), libfastudp (shared and static) with fastudp.h and
# fastudp.pc (scripts/capi.sh install --prefix /usr), and the systemd unit
# packaging/fastudp-quic.service (installed, not enabled). cargo-deb is
# installed when missing (`cargo install cargo-deb --locked`, about 3 min).
set -euo pipefail
cd "$(dirname "$0")/.."

target=${CARGO_TARGET_DIR:-target}
out=$target/release/deb
if ! cargo deb --version >/dev/null 2>&1; then
  cargo install cargo-deb --locked
fi

cargo build --release --locked -p fastudp-cli --bin fastudp
rm -rf "$out"
mkdir -p "$out/man" "$out/completions"
"$target/release/fastudp" man --dir "$out/man" >/dev/null
"$target/release/fastudp" completions bash >"$out/completions/fastudp"
"$target/release/fastudp" completions zsh >"$out/completions/_fastudp"
"$target/release/fastudp" completions fish >"$out/completions/fastudp.fish"
gzip -9n "$out"/man/*.1
scripts/capi.sh install --prefix /usr --destdir "$PWD/$out/capi" >/dev/null
cargo deb -p fastudp-cli --no-build --locked
deb=$(ls -t "$target"/debian/fastudp_*.deb | head -1)
echo "deb: $deb"
dpkg-deb --contents "$deb" | awk '{print $NF}' | sed 's/^/deb:   /'

if [ "${1:-}" = install ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "deb.sh install: needs root (apt-get install)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --reinstall "./$deb"
  test "$(command -v fastudp)" = /usr/bin/fastudp || {
    echo "deb.sh: fastudp in PATH is $(command -v fastudp), not /usr/bin/fastudp" >&2
    exit 1
  }
  /usr/bin/fastudp --version
  want=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
  /usr/bin/fastudp --version | grep -qx "fastudp $want"
  test -f /usr/share/man/man1/fastudp.1.gz
  test -f /usr/share/man/man1/fastudp-quic-serve.1.gz
  zcat /usr/share/man/man1/fastudp.1.gz | grep '^\.TH fastudp 1' >/dev/null
  unit=/lib/systemd/system/fastudp-quic.service
  test -f "$unit" || unit=/usr/lib/systemd/system/fastudp-quic.service
  test -f "$unit"
  # The unit as systemd reads it (its directives, ExecStart and
  # ExecReload executables), where systemd-analyze is there; and what the
  # operations rely on: a drain on SIGTERM with time for it, SIGHUP on reload.
  if command -v systemd-analyze >/dev/null 2>&1; then
    systemd-analyze verify "$unit"
  else
    echo "deb.sh: systemd-analyze not found; the unit's syntax is not checked" >&2
  fi
  grep -qx 'KillSignal=SIGTERM' "$unit"
  grep -qx 'ExecReload=/bin/kill -HUP $MAINPID' "$unit"
  grep -qx 'AmbientCapabilities=CAP_NET_BIND_SERVICE' "$unit"
  grep -qx 'DynamicUser=yes' "$unit"
  stop=$(sed -n 's/^TimeoutStopSec=\([0-9]*\)s$/\1/p' "$unit")
  drain=$(/usr/bin/fastudp quic serve --help | tr '\n' ' ' |
    sed -n 's/.*--drain-timeout <SECONDS>[^[]*\[default: \([0-9.]*\)\].*/\1/p')
  [ -n "$stop" ] && [ -n "$drain" ] && awk -v s="$stop" -v d="$drain" 'BEGIN { exit !(s > d) }' || {
    echo "deb.sh: TimeoutStopSec ($stop s) must be above the default --drain-timeout ($drain s)" >&2
    exit 1
  }
  # libfastudp through pkg-config, and a C program linked against it.
  pkg-config --exists fastudp
  test "$(pkg-config --modversion fastudp)" = "$want"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  printf '#include <fastudp.h>\nint main(void) { return fastudp_version() == 0; }\n' >"$tmp/v.c"
  if cc -o "$tmp/v" "$tmp/v.c" $(pkg-config --cflags --libs fastudp) 2>"$tmp/cc.err"; then
    "$tmp/v"
    # /lib is /usr/lib on a merged-/usr system: the loader may name either.
    ldd "$tmp/v" | grep -E "libfastudp.so.0.1 => (/usr)?/lib/libfastudp.so.0.1" >/dev/null
  else
    cat "$tmp/cc.err" >&2
    exit 1
  fi
  # The bash completion, as bash-completion loads it.
  bash -c 'source /usr/share/bash-completion/completions/fastudp;
    COMP_WORDS=(fastudp doc); COMP_CWORD=1; _fastudp fastudp doc fastudp;
    [ "${COMPREPLY[*]}" = doctor ]'
  /usr/bin/fastudp doctor
  echo "deb.sh install: $deb installed and checked"
fi
