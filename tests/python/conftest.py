"""Fixtures of the Python tests: a private SLUICE_HOME, a real s3rver, a real sluiced."""

import os
import sys

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("SLUICE_BUILD", os.path.join(REPO, "build"))
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))

import s3_harness  # noqa: E402  (the integration tests' s3rver)
import sluiced_harness  # noqa: E402

import sluice  # noqa: E402


def binary(name):
    return os.path.join(BUILD, "bin", name)


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """Every test has its own SLUICE_HOME and no AWS settings from the machine."""
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))
    for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN",
              "SLUICE_LEDGER"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "S3RVER")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "S3RVER")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setattr(sluice._session, "_default", None)


@pytest.fixture
def session(tmp_path):
    return sluice.connect(home=str(tmp_path / "home"), daemon="none")


@pytest.fixture(scope="session")
def s3server():
    if not s3_harness.find_s3rver():
        pytest.skip("s3rver not installed (scripts/install-test-tools.sh installs it)")
    server = s3_harness.S3rver(buckets=("test", "data", "ckpt"))
    yield server
    server.close()


@pytest.fixture
def s3(s3server, tmp_path):
    """A session whose s3:// is the test's s3rver (the embedded cache, no daemon)."""
    return sluice.connect(home=str(tmp_path / "home"), daemon="none",
                          endpoint_url=s3server.endpoint)


class Daemon(sluiced_harness.Sluiced):
    """The build's sluiced over WORKDIR/dcache (1 MiB chunks, no RAM tier), reading s3://
    from `endpoint`; `extra` flags after those."""

    def __init__(self, workdir, endpoint, *extra):
        super().__init__(binary("sluiced"), os.path.join(workdir, "sluiced.sock"),
                         os.path.join(workdir, "dcache"),
                         ["--chunk-size", "1M", "--cache-ram", "0", "--endpoint-url", endpoint,
                          *extra])


@pytest.fixture
def daemon(s3server, tmp_path):
    if not os.path.exists(binary("sluiced")):
        pytest.skip(f"no sluiced in {BUILD}/bin")
    d = Daemon(str(tmp_path), s3server.endpoint)
    yield d
    d.stop()
