#!/usr/bin/env bash
# Runs the Python tests (pytest, in the project's .venv) against the module the main build
# made: tests/python/run.sh BUILD SOURCE. SKIP (77) where .venv or the module is missing.
set -uo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
py="$src/.venv/bin/python"
if [[ ! -x "$py" ]]; then
  echo "SKIP: no $src/.venv (scripts/install-python.sh makes it; make test runs it)"
  exit 77
fi
if ! compgen -G "$build/python/sluice/_core*.so" >/dev/null; then
  echo "SKIP: no sluice._core in $build/python (this build has SLUICE_PYTHON off)"
  exit 77
fi
export PYTHONPATH="$build/python" SLUICE_BUILD="$build"
# From a directory of its own: nothing a library drops in the working directory (libcufile
# writes cufile.log) lands in the source tree.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
"$py" -m pytest -q -p no:cacheprovider -ra --rootdir "$src/tests/python" "$src/tests/python"
