#!/usr/bin/env bash
# Installs the Debian packages sluice needs to build, test and benchmark, if any are
# missing. Idempotent and non-interactive: a machine that has them all is left alone.
#   scripts/install-deps.sh          build and test packages
#   scripts/install-deps.sh --bench  also the anchor tools the benchmarks compare against
#   scripts/install-deps.sh --fuzz   also clang and libFuzzer (scripts/fuzz.sh): clang 19, as
#                                    clang 14 and 16 cannot compile libstdc++ 12's <expected>
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config   # toolchain
  python3                                        # test drivers (standard library only)
  pybind11-dev python3-dev python3-venv          # the Python module (python/) and its .venv
  liburing-dev                                   # io_uring engine (chosen at run time)
  nlohmann-json3-dev                             # JSON (bench output, telemetry export)
  libcli11-dev                                   # CLI parsing
  libgtest-dev                                   # unit tests
  libssl-dev                                     # SHA-256, HMAC, MD5 (S3 SigV4 signing)
  python3-botocore                               # S3 signing cross-check (sigv4_botocore_test)
  libcurl4-openssl-dev                           # HTTP for the s3:// store
  libpugixml-dev                                 # S3 XML responses
  libxxhash-dev                                  # XXH3 checksums of cache chunks
  libmicrohttpd-dev                              # sluiced peer and /metrics HTTP server
  libinih-dev                                    # ~/.aws/credentials and ~/.aws/config
  libsqlite3-dev                                 # the embedded ledger (quotas, usage)
  libpq-dev                                      # the PostgreSQL ledger of a fleet
  clang-format                                   # formatting check
  ccache                                         # compiler cache shared by every build and clone
)
case "${1:-}" in
  --bench) packages+=(fio awscli curl rclone iperf3 python3-torch) ;;
  --fuzz) packages+=(clang-19 libclang-rt-19-dev) ;;  # libclang-rt: libFuzzer, ASan, UBSan
esac

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi

echo "sluice: installing missing Debian packages: ${missing[*]}" >&2
SUDO=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "sluice: need root or sudo to install ${missing[*]}" >&2; exit 1; }
  SUDO=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
