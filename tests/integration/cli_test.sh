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
SLUICED=$(dirname "$SLUICE")/sluiced  # defect 18: the daemon's help offers no client flag
if [[ -x "$SLUICED" ]]; then
  "$SLUICED" --help | grep -q -- "--daemon" && bad "sluiced --help lists the client's --daemon" \
    || ok "sluiced --help lists no --daemon"
fi
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

# Defect 1: a read benchmark never writes, and never lays out anything but a regular file.
if command -v losetup >/dev/null && truncate -s 16M "$work/disk.img" &&
   dev=$(losetup --find --show "$work/disk.img" 2>/dev/null); then
  head -c 16M /dev/urandom > "$work/disk.orig"
  dd if="$work/disk.orig" of="$dev" bs=1M status=none conv=fsync
  if "$SLUICE" bench --file "$dev" --size 8M --rw read --mode direct >/dev/null 2>"$work/err" &&
     cmp -s "$dev" "$work/disk.orig"; then ok "bench read on a block device leaves it untouched"
  else bad "bench read on a block device: $(cat "$work/err"); cmp: $(cmp "$dev" "$work/disk.orig" 2>&1)"; fi
  expect_fail "bench write on a block device is refused" "block device" "$SLUICE" bench --file "$dev" --size 1M --rw write
  expect_fail "bench --verify on a block device is refused" "--verify" "$SLUICE" bench --file "$dev" --size 1M --verify
  expect_fail "bench --size past the device's end" "larger than" "$SLUICE" bench --file "$dev" --size 32M
  cmp -s "$dev" "$work/disk.orig" && ok "refused runs left the device untouched" || bad "device changed"
  losetup -d "$dev"
else
  echo "SKIP - block device checks: no loop device here (losetup needs root and /dev/loop-control)"
fi
mkfifo "$work/fifo"
expect_fail "bench on a FIFO fails at once" "FIFO" timeout 10 "$SLUICE" bench --file "$work/fifo" --size 1M
expect_fail "bench on a character device" "character device" "$SLUICE" bench --file /dev/null --size 1M
expect_fail "bench under /proc" "/proc" "$SLUICE" bench --file /proc/self/status --size 1M
ln -s /proc/self/status "$work/proc-link"  # defect 16: the path a link resolves to decides
expect_fail "bench through a link into /proc" "/proc" "$SLUICE" bench --file "$work/proc-link" --size 1M
expect_fail "bench --runtime nan" "--runtime" "$SLUICE" bench --file "$work/f.dat" --runtime nan
expect_fail "bench --runtime inf" "--runtime" "$SLUICE" bench --file "$work/f.dat" --runtime inf

# Usage errors name what is wrong and exit 2.
expect_usage() {  # like expect_fail, but the exit status must be 2
  local name=$1 want=$2; shift 2
  local err; err=$("$@" 2>&1 >/dev/null); local rc=$?
  if [[ $rc -eq 2 && "$err" == *"$want"* ]]; then ok "$name"; else bad "$name (rc=$rc, stderr: $err)"; fi
}
expect_usage "unknown command is named" "frobnicate" "$SLUICE" frobnicate
expect_usage "unknown nested command is named" "sluice ckpt rm" "$SLUICE" ckpt rm --series x
expect_usage "unknown nested command lists the others" "set" "$SLUICE" gc rule frob
expect_usage "a group without its command names them" "needs a command: ls, set" "$SLUICE" capacity
expect_usage "a parse error reads like every error" "sluice: error: " "$SLUICE" cp
expect_usage "doctor refuses /proc" "kernel interface" "$SLUICE" doctor --path /proc/self/status
expect_usage "doctor refuses /sys" "kernel interface" "$SLUICE" doctor --path /sys
mkdir -p "$work/dscratch"
expect_usage "a scratch file too small is a usage error" "at least 16 MiB" \
  "$SLUICE" doctor --path "$work/dscratch" --scratch-size 8M --seconds 1
# Durations take units wherever a flag is a duration.
SLUICE_HOME="$work/home" "$SLUICE" ckpt gc --series none --from "$work/no-tier" --grace 1h \
  2>"$work/err" >/dev/null
grep -q "Could not convert" "$work/err" && bad "ckpt gc --grace 1h: $(cat "$work/err")" \
  || ok "ckpt gc --grace takes 1h"
expect_usage "a duration with a bad unit" "expected a duration" "$SLUICE" ckpt gc --series x --grace 1y
expect_usage "a policy duration needs its unit" "give the unit" "$SLUICE" ckpt gc --series x --grace 30
printf 'x' > "$work/same"
expect_usage "cp onto itself" "same" "$SLUICE" cp "$work/same" "$work/same"
expect_usage "cp --part-size above 5G" "--part-size" "$SLUICE" cp "$work/same" "$work/other" --part-size 100G

# cp between local paths and memory, and its guards.
head -c 3000000 /dev/urandom > "$work/src.bin"
long=$(printf 'n%.0s' $(seq 250))
if "$SLUICE" cp "$work/src.bin" "$work/dst/$long" --no-progress >/dev/null 2>"$work/err" && cmp -s "$work/src.bin" "$work/dst/$long" &&
   [[ $(ls -A "$work/dst") == "$long" ]]; then ok "cp file to file, 250-byte name, nothing else left"
else bad "cp file to file: $(cat "$work/err")"; fi
if "$SLUICE" cp "$work/src.bin" mem://scratch/k --json | grep -q '"objects":1'; then ok "cp file to mem://"
else bad "cp file to mem://"; fi
expect_fail "cp of a FIFO fails at once" "not a regular file" timeout 10 "$SLUICE" cp "$work/fifo" "$work/out"
expect_fail "cp onto a FIFO refuses to replace it" "FIFO" timeout 10 "$SLUICE" cp "$work/src.bin" "$work/fifo"
[[ -p "$work/fifo" ]] && ok "the FIFO is still a FIFO" || bad "cp replaced the FIFO"
expect_fail "cp error with a newline in the name stays on one line" 'a\nb' "$SLUICE" cp "$work/a
b" "$work/out"
if command -v setpriv >/dev/null && [[ $(id -u) -eq 0 ]]; then
  mkdir -p "$work/locked" && chmod 755 "$work/locked" && chmod 755 "$work"
  mkdir -p "$work/tree" && printf 'x' > "$work/tree/f" && chmod -R a+rX "$work/tree"
  expect_fail "cp -r into a directory that cannot be created names the cause" "permission_denied" \
    setpriv --reuid 65534 --regid 65534 --clear-groups "$SLUICE" cp -r "$work/tree" "$work/locked/sub/dir"
else
  echo "SKIP - permission check: needs root and setpriv to run as another user"
fi

expect_usage "cp to a scheme nobody serves" "known schemes" "$SLUICE" cp "$work/src.bin" gopher://b/x
expect_usage "cp to a key no store can hold" "empty path component" "$SLUICE" cp "$work/src.bin" mem://scratch/a//b
if "$SLUICE" bench --file "$work/f.dat" --bs 64K --runtime 1s >/dev/null 2>"$work/err"; then
  ok "bench --runtime takes a duration"
else bad "bench --runtime 1s: $(cat "$work/err")"; fi

# Checkpoint steps that are not there: an error that names the step, never a silent pass.
mkdir -p "$work/ck" && head -c 100000 /dev/urandom > "$work/ck/model.bin"
SLUICE_HOME="$work/home" "$SLUICE" ckpt save --series s --step 1 --to "$work/tier" "$work/ck" >/dev/null
for cmd in verify show; do
  expect_fail "ckpt $cmd of a step no tier holds" "no step 9 of series s on" \
    env SLUICE_HOME="$work/home" "$SLUICE" ckpt $cmd --series s --step 9 --from "$work/tier"
done
expect_usage "ckpt verify --step names 'all'" "'latest' or 'all'" \
  env SLUICE_HOME="$work/home" "$SLUICE" ckpt verify --series s --step abc --from "$work/tier"
err=$(SLUICE_HOME="$work/home" "$SLUICE" ckpt ls --series nosuch --from "$work/tier" 2>&1 >/dev/null)
[[ "$err" == *"no committed step of series nosuch"* ]] && ok "ckpt ls of an empty series says what it looked at" \
  || bad "ckpt ls --series nosuch: $err"

# The bench demo runs twice in a row (it owns its files and starts fresh each time).
for run in 1 2; do
  if SLUICE_HOME="$work/home" "$SLUICE" demo --bench --size 8M >"$work/demo.out" 2>&1 && grep -q "uring     read" "$work/demo.out"; then
    ok "demo --bench run $run"
  else bad "demo --bench run $run: $(tail -5 "$work/demo.out")"; fi
done
[[ -z "$(ls -A "$work/home/demo")" ]] && ok "demo --bench leaves no files" || bad "demo --bench left $(ls "$work/home/demo")"

# The training demo: killed and resumed, every sample once per epoch; twice in a row.
for run in 1 2; do
  if SLUICE_HOME="$work/home" "$SLUICE" demo --samples 2000 >"$work/demo.out" 2>&1 &&
     grep -q "killed with SIGKILL" "$work/demo.out" && grep -q "restored step" "$work/demo.out" &&
     grep -q "samples once (.*) OK" "$work/demo.out"; then
    ok "demo run $run"
  else bad "demo run $run: $(tail -8 "$work/demo.out")"; fi
done

# A corrupted file is caught by --verify, naming the offset.
printf 'XXXX' | dd of="$work/f.dat" bs=1 seek=70000 conv=notrunc status=none
expect_fail "verify catches corruption" "offset 70000" "$SLUICE" bench --file "$work/f.dat" --bs 64K --verify

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
