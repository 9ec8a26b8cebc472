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
    with pytest.raises(FileNotFoundError):  # a prefix with no objects is no folder
        fs.ls("test/fs")


# ---- issue 47: fsspec as fsspec users expect (each fails on the code before the fix) ------


@pytest.fixture(params=["cache+file", "cache+s3"])
def fs_root(request, tmp_path):
    """A SluiceFileSystem and an empty folder of it, for each protocol."""
    options = {"home": str(tmp_path / "h"), "daemon": "none"}
    if request.param == "cache+file":
        return sluice.fs.SluiceFileSystem(session_options=options), str(tmp_path / "fs")
    options["endpoint_url"] = request.getfixturevalue("s3server").endpoint
    return sluice.fs.SluiceFileSystem(session_options=options), f"test/fs-{tmp_path.name}"


def test_fsspec_cp_copies_a_file(fs_root):
    fs, root = fs_root
    fs.pipe_file(f"{root}/a.bin", b"copied bytes")
    fs.cp(f"{root}/a.bin", f"{root}/new/b.bin")
    assert fs.cat_file(f"{root}/new/b.bin") == b"copied bytes"
    assert fs.cat_file(f"{root}/a.bin") == b"copied bytes"


def test_fsspec_ls_of_a_missing_path_raises(fs_root):
    fs, root = fs_root
    fs.pipe_file(f"{root}/a.bin", b"x")
    with pytest.raises(FileNotFoundError):
        fs.ls(f"{root}/missing")
    assert fs.ls(f"{root}/a.bin", detail=False) == [f"{root}/a.bin"]  # a file lists itself


def test_fsspec_open_xb_creates_exclusively(fs_root):
    fs, root = fs_root
    with fs.open(f"{root}/x.bin", "xb") as f:
        f.write(b"first")
    with pytest.raises(FileExistsError):
        fs.open(f"{root}/x.bin", "xb")
    with pytest.raises(FileExistsError):
        fs.pipe_file(f"{root}/x.bin", b"second", mode="create")
    assert fs.cat_file(f"{root}/x.bin") == b"first"


def test_fsspec_rm_recursive_removes_a_local_tree(tmp_path):
    root = tmp_path / "tree"
    (root / "sub" / "nested").mkdir(parents=True)
    (root / "empty").mkdir()
    for p in ("a", "sub/b", "sub/nested/c"):
        (root / p).write_bytes(b"x")
    fs = fsspec.filesystem("cache+file", session_options={"home": str(tmp_path / "h"),
                                                          "daemon": "none"})
    fs.rm(str(root), recursive=True)
    assert not root.exists()
    assert not fs.exists(str(root))


def test_fsspec_sees_an_empty_local_directory(tmp_path):
    fs = fsspec.filesystem("cache+file", session_options={"home": str(tmp_path / "h"),
                                                          "daemon": "none"})
    d = str(tmp_path / "top" / "empty")
    fs.mkdir(d)
    assert fs.isdir(d)
    assert fs.info(d)["type"] == "directory"
    assert fs.ls(d) == []
    assert fs.ls(str(tmp_path / "top"), detail=False) == [d]
    fs.rm(d)
    assert not fs.exists(d)
