#!/usr/bin/env bash
# Runs every fuzz target (fuzz/fuzz_targets/) for a bounded time, one after
# the other, and prints each one's runs and executions per second.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#
# SECONDS per target (default 30, what CI runs); TARGETs default to all.
# Each target starts from its checked-in seeds (fuzz/seeds/<target>) and
# the corpus earlier runs grew (fuzz/corpus/<target>, not checked in). A
# crash leaves its input in fuzz/artifacts/<target>/ and fails the script
# once every target has run; reproduce it with
#   RUSTC_BOOTSTRAP=1 cargo fuzz run <target> fuzz/artifacts/<target>/<file>
#
# cargo-fuzz builds with nightly flags (-Zsanitizer=address). The stable
# compiler takes them with RUSTC_BOOTSTRAP=1 (the Unstable Book,
# "RUSTC_BOOTSTRAP"), so no nightly toolchain is needed.
set -euo pipefail
cd "$(dirname "$0")/.."

secs=${1:-30}
shift || true
case $secs in
  '' | *[!0-9]*)
    echo "usage: scripts/fuzz.sh [SECONDS] [TARGET...]" >&2
    exit 2
    ;;
esac
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "error: cargo-fuzz not found: cargo install --locked cargo-fuzz" >&2
  exit 1
fi
export RUSTC_BOOTSTRAP=1

if [ $# -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <(cargo fuzz list)
fi
# One build for every target, then runs that find it up to date.
cargo fuzz build

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
failed=()
for t in "${targets[@]}"; do
  mkdir -p "fuzz/corpus/$t"
  echo "== $t: ${secs} s"
  # -timeout: one input taking 10 s is a hang. The corpus directory comes
  # first: libFuzzer writes new inputs there, never to the seeds.
  if cargo fuzz run "$t" "fuzz/corpus/$t" "fuzz/seeds/$t" -- \
    -max_total_time="$secs" -timeout=10 -print_final_stats=1 \
    >"$logs/$t" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$logs/$t")
    speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$logs/$t")
    cov=$(grep -o 'cov: [0-9]*' "$logs/$t" | tail -n 1)
    echo "   ok: ${runs:-?} runs, ${speed:-?} execs/s, ${cov:-cov: ?}"
  else
    failed+=("$t")
    echo "   FAILED: the crashing input is in fuzz/artifacts/$t/"
    tail -n 40 "$logs/$t"
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzzing found crashes in: ${failed[*]}" >&2
  exit 1
fi
