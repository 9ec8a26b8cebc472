#!/usr/bin/env bash
# Makes the project's virtual environment, .venv, with what the Python tests need
# (python/requirements-test.txt), from PyPI. Reused when its requirements have not changed:
# a stamp records the hash of the file it was made from. The sluice package itself is not
# installed into it: the tests import the module the main build makes (BUILD/python), so
# the C++ core is compiled once; `pip install .` is for users.
#   scripts/install-python.sh            make or refresh .venv
#   scripts/install-python.sh --bench    also the anchors bench/py_data_compare.py compares
#                                        sluice with (bench/requirements-anchors.txt)
#   SLUICE_VENV=DIR scripts/...          somewhere else
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${SLUICE_VENV:-.venv}
case "${1:-}" in
  "") bench=0 ;;
  --bench) bench=1 ;;
  *) echo "usage: scripts/install-python.sh [--bench]" >&2; exit 2 ;;
esac
req=python/requirements-test.txt
want=$(sha256sum "$req" | cut -d' ' -f1)
stamp="$venv/.sluice-requirements"

anchors() {
  local areq=bench/requirements-anchors.txt astamp="$venv/.sluice-anchors" awant
  awant=$(sha256sum "$areq" | cut -d' ' -f1)
  [[ -f "$astamp" && "$(cat "$astamp")" == "$awant" ]] && return 0
  echo "sluice: installing the benchmark anchors into $venv ($areq; about a minute)" >&2
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --progress-bar off -r "$areq"
  echo "$awant" > "$astamp"
}

if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  if (( bench )); then anchors; fi
  exit 0
fi
python=${PYTHON:-python3}
if ! "$python" -c 'import venv, ensurepip' 2>/dev/null; then
  echo "sluice: $python cannot make a virtual environment (Debian: apt-get install python3-venv)" >&2
  exit 1
fi
echo "sluice: making $venv for the Python tests (torch, torchdata, numpy, pytest, fsspec, webdataset; about 5 GB, a few minutes)" >&2
start=$(date +%s)
[[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --progress-bar off -r "$req"
echo "$want" > "$stamp"
echo "sluice: $venv ready in $(( $(date +%s) - start )) s ($(du -sh "$venv" | cut -f1))" >&2
if (( bench )); then anchors; fi
