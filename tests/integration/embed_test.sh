#!/usr/bin/env bash
# sluice as a library for a program outside its build: install the build to a prefix, build
# examples/embed against it with find_package(sluice), and read an object through the
# embedded cache with it.
#   embed_test.sh BUILD_DIR SOURCE_DIR [EXTRA_CXX_FLAGS]
# EXTRA_CXX_FLAGS: what the library was built with that a consumer must match (the
# sanitizers of the ASan build).
set -uo pipefail
build=${1:?usage: embed_test.sh BUILD_DIR SOURCE_DIR [EXTRA_CXX_FLAGS]}
src=${2:?usage: embed_test.sh BUILD_DIR SOURCE_DIR [EXTRA_CXX_FLAGS]}
flags=${3:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pass=0 fail=0
ok()  { pass=$((pass+1)); echo "ok   - $1"; }
bad() { fail=$((fail+1)); echo "FAIL - $1"; }

if ! cmake --install "$build" --prefix "$work/prefix" >"$work/install.log" 2>&1; then
  cat "$work/install.log"; echo "FAIL - cmake --install"; exit 1
fi
[[ -f "$work/prefix/lib/cmake/sluice/sluiceConfig.cmake" ]] && ok "the install has sluiceConfig.cmake" \
  || bad "no sluiceConfig.cmake under $work/prefix/lib/cmake/sluice"

generator=("-G" "Unix Makefiles")
command -v ninja >/dev/null && generator=("-G" "Ninja")
if cmake -S "$src/examples/embed" -B "$work/embed" "${generator[@]}" \
     -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_CXX_FLAGS="$flags" \
     -DCMAKE_EXE_LINKER_FLAGS="$flags" >"$work/configure.log" 2>&1 &&
   cmake --build "$work/embed" >"$work/build.log" 2>&1; then
  ok "examples/embed builds against the install with find_package(sluice)"
else
  cat "$work/configure.log" "$work/build.log" | tail -30
  bad "examples/embed does not build against the install"
  echo "$pass passed, $fail failed"; exit 1
fi
embed=$work/embed/sluice_embed
# It asked for client_core alone: neither the ledger's libraries nor the daemon's are linked.
linked=$(ldd "$embed" 2>/dev/null | grep -E 'libsqlite3|libpq|libmicrohttpd' || true)
[[ -z "$linked" ]] && ok "a reader linked against client_core links no SQLite, libpq or libmicrohttpd" \
  || bad "client_core brought in: $linked"

mkdir -p "$work/home" "$work/data"
head -c 9000000 /dev/urandom >"$work/data/obj"
out=$("$embed" "$work/home" "file://$work/data" obj 2>"$work/err")
rc=$?
if [[ $rc -eq 0 && "$out" == *"size 9000000"* && "$out" == *"through cache+file://"* ]]; then
  ok "reads an object through the embedded cache, twice, the same bytes"
else
  bad "sluice_embed: rc=$rc out=$out err=$(cat "$work/err")"
fi
grep -q "embedded cache" "$work/err" && ok "says why it used the embedded cache" \
  || bad "no word on the fallback: $(cat "$work/err")"
[[ -n "$(ls -A "$work/home/cache/chunks" 2>/dev/null)" ]] && ok "the cache kept chunks in HOME/cache" \
  || bad "nothing in $work/home/cache/chunks"

err=$("$embed" "$work/home" "file://$work/data" missing 2>&1 >/dev/null)
rc=$?
[[ $rc -ne 0 && "$err" == *missing* ]] && ok "a missing object is an error naming it" \
  || bad "missing object: rc=$rc err=$err"

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
