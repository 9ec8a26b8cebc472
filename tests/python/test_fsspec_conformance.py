"""fsspec's own conformance suite (fsspec.tests.abstract: copy, get, put, open, pipe), wired
as s3fs and gcsfs wire it, against SluiceFileSystem for cache+file (a temporary directory)
and cache+s3 (the tests' s3rver). A test that a documented limit excludes (docs/python.md,
"fsspec") would be marked xfail here with its reason; today none is: every test passes."""

import uuid

import fsspec.tests.abstract as abstract
import pytest

from sluice.fs import SluiceFileSystem


class FileFixtures(abstract.AbstractFixtures):
    """cache+file: local directories, which may be empty."""

    @pytest.fixture(scope="class")
    @classmethod
    def fs(cls, tmp_path_factory):
        home = tmp_path_factory.mktemp("fsspec-file-home")
        return SluiceFileSystem(session_options={"home": str(home), "daemon": "none"})

    @pytest.fixture
    def fs_path(self, tmp_path):
        return str(tmp_path / "sluice")  # beside local_path (tmpdir itself), never in it


class S3Fixtures(abstract.AbstractFixtures):
    """cache+s3 on s3rver: a folder is a prefix, so there are no empty folders."""

    @pytest.fixture(scope="class")
    @classmethod
    def fs(cls, s3server, tmp_path_factory):
        home = tmp_path_factory.mktemp("fsspec-s3-home")
        return SluiceFileSystem(session_options={"home": str(home), "daemon": "none",
                                                 "endpoint_url": s3server.endpoint})

    @pytest.fixture
    def fs_path(self):
        return f"test/fsspec-{uuid.uuid4().hex[:12]}"

    @pytest.fixture
    def supports_empty_directories(self):
        return False


class TestFileCopy(abstract.AbstractCopyTests, FileFixtures):
    pass


class TestFileGet(abstract.AbstractGetTests, FileFixtures):
    pass


class TestFilePut(abstract.AbstractPutTests, FileFixtures):
    pass


class TestFileOpen(abstract.AbstractOpenTests, FileFixtures):
    pass


class TestFilePipe(abstract.AbstractPipeTests, FileFixtures):
    pass


class TestS3Copy(abstract.AbstractCopyTests, S3Fixtures):
    pass


class TestS3Get(abstract.AbstractGetTests, S3Fixtures):
    pass


class TestS3Put(abstract.AbstractPutTests, S3Fixtures):
    pass


class TestS3Open(abstract.AbstractOpenTests, S3Fixtures):
    pass


class TestS3Pipe(abstract.AbstractPipeTests, S3Fixtures):
    pass
