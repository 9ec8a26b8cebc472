#!/usr/bin/env bash
# Installs the test-only tools that come from the npm registry into .cache/npm:
#   s3rver 3.7.1   a real S3 server the integration tests start on loopback
# Idempotent. Without npm (and no way to install it) the S3 tests report SKIP.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=.cache/npm
if [[ -x $prefix/node_modules/.bin/s3rver ]]; then
  exit 0
fi
if ! command -v npm >/dev/null; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "sluice: installing nodejs and npm (Debian) for the S3 test server" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
  else
    echo "sluice: npm not found: the S3 integration tests will SKIP" >&2
    exit 0
  fi
fi
echo "sluice: installing s3rver 3.7.1 into $prefix (test tool)" >&2
mkdir -p "$prefix"
npm install --silent --no-audit --no-fund --prefix "$prefix" s3rver@3.7.1 >/dev/null
