#!/usr/bin/env bash
# Runs the C example's commands exactly as the README and docs/C.md show
# them, so that the documented commands are the tested ones:
#
#   scripts/readme-c.sh
#
# The commands are read from README.md, between the `readme-c` markers;
# docs/C.md must show the same block (the script fails if they differ).
# They install libfastudp into "$HOME/.local": to leave your home alone,
# the script runs them with HOME set to a temporary directory (cargo and
# rustup keep using your CARGO_HOME and RUSTUP_HOME). Then it checks the
# two static links docs/C.md documents, the same way.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

# The lines between the markers, without the ``` fences.
block() {
    sed -n "/<!-- $2:begin -->/,/<!-- $2:end -->/p" "$1" | sed '1d;$d' | sed '/^```/d'
}
readme=$(block README.md readme-c)
doc=$(block docs/C.md readme-c)
if [ -z "$readme" ]; then
    echo "readme-c.sh: no readme-c block in README.md" >&2
    exit 1
fi
if [ "$readme" != "$doc" ]; then
    echo "readme-c.sh: README.md and docs/C.md show different C commands:" >&2
    diff <(echo "$readme") <(echo "$doc") >&2 || true
    exit 1
fi
static=$(block docs/C.md readme-c-static)
# docs/C.md shows examples/c/hello.c whole: the copy must be the file.
if ! diff <(sed -n '/^```c$/,/^```$/p' docs/C.md | sed '1d;$d' | head -n "$(wc -l <examples/c/hello.c)") examples/c/hello.c >/dev/null; then
    echo "readme-c.sh: the program in docs/C.md is not examples/c/hello.c" >&2
    exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; rm -f "$repo/hello" "$repo/hello-static"' EXIT
export CARGO_HOME=${CARGO_HOME:-$HOME/.cargo}
export RUSTUP_HOME=${RUSTUP_HOME:-$HOME/.rustup}

echo "+ the README's C commands, with HOME=$tmp:"
echo "$readme" | sed 's/^/    /'
out=$(HOME=$tmp bash -euo pipefail -c "$readme")
echo "$out"
# The program checks every datagram itself; this checks it said so.
grep -q "received all 4 datagrams" <<<"$out"
# It found the library through the rpath, not a search path.
HOME=$tmp bash -c 'ldd ./hello' | grep "libfastudp.so.* => $tmp/.local/lib/" >/dev/null || {
    echo "readme-c.sh: ./hello does not load $tmp/.local/lib/libfastudp.so" >&2
    ldd ./hello >&2
    exit 1
}

echo "+ the static links of docs/C.md:"
echo "$static" | sed 's/^/    /'
out=$(HOME=$tmp bash -euo pipefail -c "export PKG_CONFIG_PATH=\"\$HOME/.local/lib/pkgconfig\"; $static")
echo "$out"
if [ "$(grep -c "received all 4 datagrams" <<<"$out")" != 2 ]; then
    echo "readme-c.sh: a statically linked hello did not run to the end" >&2
    exit 1
fi
echo "readme-c.sh: the documented C commands work"
