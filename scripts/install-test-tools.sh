#!/usr/bin/env bash
# Installs the test-only tools:
#   s3rver 3.7.1   a real S3 server the integration tests start on loopback (npm registry,
#                  into .cache/npm)
#   PostgreSQL 15  a real PostgreSQL server for the ledger tests (Debian package
#                  postgresql; tests/integration/pg_harness.py runs a private one)
#   Ceph 16 RGW    a real S3 server that checks SigV4 signatures and conditional requests
#                  (Debian packages radosgw ceph-mon ceph-osd ceph-common, about 45 packages
#                  and 15-30 s; tests/integration/rgw_harness.py runs it)
# Idempotent. Without npm the S3 tests report SKIP; without PostgreSQL the ledger's
# PostgreSQL tests report SKIP; without the Ceph packages (not root, no
# password-less sudo, apt failed, or SLUICE_SKIP_CEPH=1) the RGW tests report SKIP. The Ceph
# part never fails this script.
set -euo pipefail
cd "$(dirname "$0")/.."

install_s3rver() {
  local prefix=.cache/npm
  if [[ -x $prefix/node_modules/.bin/s3rver ]]; then
    return 0
  fi
  if ! command -v npm >/dev/null; then
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
      echo "sluice: installing nodejs and npm (Debian) for the S3 test server" >&2
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
    else
      echo "sluice: npm not found: the S3 integration tests will SKIP" >&2
      return 0
    fi
  fi
  echo "sluice: installing s3rver 3.7.1 into $prefix (test tool)" >&2
  mkdir -p "$prefix"
  npm install --silent --no-audit --no-fund --prefix "$prefix" s3rver@3.7.1 >/dev/null
}

# True when everything rgw_harness.py needs is there: the daemons, the tools, and the
# Python rados module for Debian's python3 (from ceph-common).
have_ceph() {
  local b
  for b in ceph-mon ceph-osd radosgw radosgw-admin ceph-authtool monmaptool; do
    command -v "$b" >/dev/null || return 1
  done
  /usr/bin/python3 -c 'import rados' 2>/dev/null
}

# apt_install WHAT SKIP PACKAGE...: installs Debian packages for a test server, as root or
# through sudo that asks no password (never a prompt); retries once after an update (a
# fresh container's package lists may be missing). Never fails: says why, then SKIP.
apt_install() {
  local what=$1 skip=$2
  shift 2
  if ! command -v apt-get >/dev/null; then
    echo "sluice: no apt-get to install $what ($*); $skip" >&2
    return 0
  fi
  local as=()
  if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
      as=(sudo -n)
    else
      echo "sluice: not root and no password-less sudo: cannot install $what; $skip" >&2
      return 0
    fi
  fi
  echo "sluice: installing $what (Debian: $*) for its tests" >&2
  local apt=("${as[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -y -qq -o Dpkg::Use-Pty=0) log
  log=$(mktemp)
  if ! "${apt[@]}" install --no-install-recommends "$@" >"$log" 2>&1; then
    "${apt[@]}" update >>"$log" 2>&1 || true
    if ! "${apt[@]}" install --no-install-recommends "$@" >>"$log" 2>&1; then
      echo "sluice: apt-get could not install $what; $skip. apt said:" >&2
      tail -n 5 "$log" | sed 's/^/  /' >&2
    fi
  fi
  rm -f "$log"
  return 0
}

install_ceph() {
  local skip="the RGW integration tests will SKIP"
  have_ceph && return 0
  if [[ -n ${SLUICE_SKIP_CEPH:-} ]]; then
    echo "sluice: SLUICE_SKIP_CEPH is set: not installing Ceph RGW; $skip" >&2
    return 0
  fi
  apt_install "Ceph RGW" "$skip" radosgw ceph-mon ceph-osd ceph-common
  have_ceph || echo "sluice: Ceph RGW is not complete; $skip" >&2
  return 0
}

# True when pg_harness.py finds a server to run: /usr/lib/postgresql/<version>/bin/initdb.
have_postgres() {
  compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null
}

install_postgres() {
  have_postgres && return 0
  apt_install PostgreSQL "the ledger's PostgreSQL tests will SKIP" postgresql
}

install_s3rver
install_postgres || true
install_ceph || true
