"""The fsspec filesystem: fsspec.open of cache+ locations reads through the node's cache;
writes are atomic; listings and info."""

import fsspec
import pytest

import sluice
import sluice.fs  # noqa: F401  (registers the protocols)


def test_fsspec_reads_local_files_through_the_cache(tmp_path):
    p = tmp_path / "d" / "a.bin"
    p.parent.mkdir()
    p.write_bytes(b"0123456789" * 1000)
    with fsspec.open(f"cache+file://{p}", "rb") as f:
        f.seek(5)
        assert f.read(10) == b"5678901234"
    fs = fsspec.filesystem("cache+file")
    assert fs.cat_file(str(p), 2, 6) == b"2345"
    assert fs.info(str(p))["size"] == 10000
    assert fs.ls(str(tmp_path / "d"), detail=False) == [str(p)]
    assert fs.exists(str(p)) and not fs.exists(str(tmp_path / "nope"))


def test_fsspec_on_s3(s3server, monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3server.endpoint)
    fs = fsspec.filesystem("cache+s3", session_options={"home": str(tmp_path / "h"),
                                                        "daemon": "none"})
    with fs.open("test/fs/x.txt", "wb") as f:
        f.write(b"hello fsspec")
    assert fs.cat_file("test/fs/x.txt") == b"hello fsspec"
    assert fs.ls("test/fs", detail=False) == ["test/fs/x.txt"]
    assert fs.info("test/fs")["type"] == "directory"
    fs.mv("test/fs/x.txt", "test/fs/y.txt")
    assert fs.ls("test/fs", detail=False) == ["test/fs/y.txt"]
    with pytest.raises(RuntimeError):
        with fs.open("test/fs/z.txt", "wb") as f:
            f.write(b"partial")
            raise RuntimeError("stop")
    assert not fs.exists("test/fs/z.txt")
    with pytest.raises(RuntimeError):  # a transaction publishes nothing when it fails
        with fs.transaction:
            with fs.open("test/fs/t.txt", "wb") as f:
                f.write(b"in a transaction")
            raise RuntimeError("stop")
    assert not fs.exists("test/fs/t.txt")
    with fs.transaction:
        with fs.open("test/fs/t.txt", "wb") as f:
            f.write(b"committed")
        assert not fs.exists("test/fs/t.txt")  # not before the transaction ends
    assert fs.cat_file("test/fs/t.txt") == b"committed"
    fs.rm_file("test/fs/t.txt")
    fs.rm_file("test/fs/y.txt")
    assert fs.ls("test/fs", detail=False) == []
