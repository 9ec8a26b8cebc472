#!/usr/bin/env bash
# The sluice CLI as a user meets it: help, a real bench run, and clear failures.
set -uo pipefail
SLUICE=${1:?usage: cli_test.sh path/to/sluice}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pass=0 fail=0
ok()   { pass=$((pass+1)); echo "ok   - $1"; }
bad()  { fail=$((fail+1)); echo "FAIL - $1"; }

# expect_fail NAME EXPECTED_STDERR_SUBSTRING CMD...
expect_fail() {
  local name=$1 want=$2; shift 2
  local err; err=$("$@" 2>&1 >/dev/null); local rc=$?
  if [[ $rc -ne 0 && "$err" == *"$want"* && $(printf '%s\n' "$err" | wc -l) -le 3 ]]; then ok "$name"
  else bad "$name (rc=$rc, stderr: $err)"; fi
}

"$SLUICE" --help | grep -q bench && ok "--help lists bench" || bad "--help lists bench"
"$SLUICE" bench --help | grep -q -- "--qd" && ok "bench --help lists --qd" || bad "bench --help"

out=$("$SLUICE" bench --file "$work/f.dat" --size 8M --mode uring --rw read --bs 64K --qd 8 --verify --json)
if [[ $? -eq 0 ]] && printf '%s' "$out" | /usr/bin/python3 -c '
import json, sys
j = json.load(sys.stdin)
for k in ("throughput_gib_s", "iops", "cpu_pct", "mode", "path"):
    assert k in j, k
for k in ("avg", "p50", "p99", "p999"):
    assert k in j["lat_us"], k
assert j["bytes"] == 8 << 20 and j["verified"] and j["mode"] == "uring"
'; then ok "bench --json has every field and verifies"; else bad "bench --json: $out"; fi

for mode in buffered direct bounce; do
  for rw in read write randread randwrite; do
    if "$SLUICE" bench --file "$work/m.dat" --size 4M --mode $mode --rw $rw --bs 16K --qd 4 --verify >/dev/null 2>"$work/err"; then
      ok "bench $mode $rw --verify"
    else bad "bench $mode $rw: $(cat "$work/err")"; fi
  done
done
if "$SLUICE" bench --file "$work/t.dat" --size 4M --bs 4K --rw randread --runtime 0.5 >/dev/null; then ok "bench --runtime"; else bad "bench --runtime"; fi

expect_fail "missing file without --size" "does not exist" "$SLUICE" bench --file "$work/nope.dat"
expect_fail "unknown mode" "unknown mode 'warp'" "$SLUICE" bench --file "$work/f.dat" --mode warp
expect_fail "unknown rw" "unknown --rw" "$SLUICE" bench --file "$work/f.dat" --rw sideways
expect_fail "size 0" "--size must be greater than 0" "$SLUICE" bench --file "$work/f.dat" --size 0
expect_fail "bad size unit" "invalid size" "$SLUICE" bench --file "$work/f.dat" --bs 4Q
expect_fail "unwritable directory" "not writable" "$SLUICE" bench --file /proc/sluice-nope/x.dat --size 1M
expect_fail "file is a directory" "is a directory" "$SLUICE" bench --file "$work" --size 1M
expect_fail "bs larger than size" "smaller than --bs" "$SLUICE" bench --file "$work/f.dat" --size 4K --bs 1M
expect_fail "gpu without CUDA" "gpu" "$SLUICE" bench --file "$work/f.dat" --mode gpu --cuda-library libcudart-absent.so
expect_fail "gds without cuFile" "gds" "$SLUICE" bench --file "$work/f.dat" --mode gds --cuda-library libcudart-absent.so

# The demo runs twice in a row (it owns its files and starts fresh each time).
for run in 1 2; do
  if SLUICE_HOME="$work/home" "$SLUICE" demo --size 8M >"$work/demo.out" 2>&1 && grep -q "uring     read" "$work/demo.out"; then
    ok "demo run $run"
  else bad "demo run $run: $(tail -5 "$work/demo.out")"; fi
done
[[ -z "$(ls -A "$work/home/demo")" ]] && ok "demo leaves no files" || bad "demo left $(ls "$work/home/demo")"

# A corrupted file is caught by --verify, naming the offset.
printf 'XXXX' | dd of="$work/f.dat" bs=1 seek=70000 conv=notrunc status=none
expect_fail "verify catches corruption" "offset 70000" "$SLUICE" bench --file "$work/f.dat" --bs 64K --verify

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
