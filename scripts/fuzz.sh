#!/usr/bin/env bash
# Fuzzes every parser (fuzz/, docs/testing.md "Fuzzing"): configures build-fuzz with clang
# and SLUICE_FUZZ=ON, builds the harnesses and every library layer (which is also the clang
# thread-safety check: -Werror=thread-safety), and runs each harness for SECONDS (default
# 60) on its working corpus (build-fuzz/corpus/<harness>, seeded from
# fuzz/corpus/<harness>, which is never written). Prints, per harness, the inputs executed,
# libFuzzer's coverage (cov: edges, ft: features) and what it found; exits 1 if any harness
# crashed, hung, ran out of memory or tripped a sanitizer, naming the input it left in
# build-fuzz/findings/<harness>/.
#   scripts/fuzz.sh [SECONDS]
#   FUZZERS="tar_fuzz uri_fuzz" scripts/fuzz.sh 30     only these
#   BUILD_FUZZ=dir JOBS=n                              build directory, parallel compiles
#   FUZZ_SUMMARY=file                                  where the summary table goes (two runs
#                                                      side by side need one each)
#   FUZZ_KEEP_GOING=1 scripts/fuzz.sh 60               go on past findings (libFuzzer's fork
#                                                      mode): for measuring a harness whose
#                                                      known finding is not fixed yet
# Reproduce a finding: build-fuzz/fuzz/<harness> build-fuzz/findings/<harness>/crash-...
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
[[ "$seconds" =~ ^[0-9]+$ && "$seconds" -gt 0 ]] || { echo "usage: $0 [SECONDS]" >&2; exit 2; }
build=${BUILD_FUZZ:-build-fuzz}
jobs=${JOBS:-$(nproc)}

scripts/install-deps.sh --fuzz
generator=$(command -v ninja >/dev/null 2>&1 && echo Ninja || echo "Unix Makefiles")
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  CC=clang-19 CXX=clang++-19 cmake -S . -B "$build" -G "$generator" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSLUICE_FUZZ=ON -DSLUICE_BUILD_TESTS=OFF >/dev/null
fi
# The harnesses, and every library layer: under clang, with -Werror=thread-safety, that is
# the check of the lock rules (docs/design.md, "Lock rules").
cmake --build "$build" -j "$jobs" --target sluice_fuzzers sluice_layers

all=$(cd fuzz && ls ./*_fuzz.cc | sed 's|^\./||; s|\.cc$||')
fuzzers=${FUZZERS:-$all}

# Stacks with function names and lines; UBSan reports stop the run (-fno-sanitize-recover).
symbolizer=$(command -v llvm-symbolizer-19 || command -v llvm-symbolizer || true)
[[ -n "$symbolizer" ]] && export ASAN_SYMBOLIZER_PATH="$symbolizer"
export UBSAN_OPTIONS="print_stacktrace=1${symbolizer:+:external_symbolizer_path=$symbolizer}"

summary=${FUZZ_SUMMARY:-$build/fuzz-summary.tsv}
printf 'harness\tseconds\texecs\tcov\tft\tcorpus\tresult\n' >"$summary"
printf '%-22s %12s %7s %7s %7s  %s\n' harness executions cov ft corpus result
failed=0
for h in $fuzzers; do
  bin="$build/fuzz/$h"
  [[ -x "$bin" ]] || { echo "fuzz.sh: no harness $bin" >&2; exit 2; }
  corpus="$build/corpus/$h" findings="$build/findings/$h" log="$build/logs/$h.log"
  mkdir -p "$corpus" "$findings" "$(dirname "$log")"
  # The committed seeds join the working corpus; what the run adds stays in build-fuzz.
  if [[ -d "fuzz/corpus/$h" ]]; then cp -n fuzz/corpus/"$h"/* "$corpus"/ 2>/dev/null || true; fi
  dict=()
  [[ -f "fuzz/$h.dict" ]] && dict=("-dict=fuzz/$h.dict")
  before=$(ls "$findings" | wc -l)
  keep_going=()
  if [[ "${FUZZ_KEEP_GOING:-0}" == 1 ]]; then
    keep_going=(-fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)
  fi
  rc=0
  "$bin" "$corpus" "${dict[@]}" "${keep_going[@]}" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$findings/" >"$log" 2>&1 || rc=$?
  # The last status line: "#N DONE cov: C ft: F corp: U/..." (fork mode: "#N: cov: ... corp: U").
  last=$(grep -E '^#[0-9]+:?[[:space:]].*cov: ' "$log" | tail -1 || true)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  [[ -n "$execs" ]] || execs=$(sed -n 's/^#\([0-9]*\).*/\1/p' <<<"$last")
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  units=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last")
  after=$(ls "$findings" | wc -l)
  if [[ $rc -ne 0 || $after -gt $before ]]; then
    failed=1
    input=$(ls -t "$findings"/* 2>/dev/null | head -1 || true)
    result="FOUND (rc $rc, $((after - before)) new): ${input:-see $log}"
  else
    result="nothing found"
  fi
  printf '%-22s %12s %7s %7s %7s  %s\n' "$h" "${execs:-?}" "${cov:-?}" "${ft:-?}" "${units:-?}" "$result"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$h" "$seconds" "${execs:-?}" "${cov:-?}" "${ft:-?}" \
    "${units:-?}" "$result" >>"$summary"
  if [[ $rc -ne 0 ]]; then
    { grep -E 'ERROR: |SUMMARY: |invariant failed|Test unit written' "$log" || true; } |
      head -5 | sed 's/^/    /'
  fi
done
echo "fuzz.sh: logs in $build/logs, summary in $summary"
if [[ $failed -ne 0 ]]; then
  echo "fuzz.sh: a harness found something: reproduce with $build/fuzz/<harness> <input>" >&2
  exit 1
fi
