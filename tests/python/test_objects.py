"""Objects from Python: round trips through every store and sluiced, zero copy, errors,
the GIL released, atomic writes."""

import hashlib
import os
import threading
import time

import numpy as np
import pytest
import torch

import sluice

MIB = 1 << 20


def pattern(n, seed=1):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def roundtrip(session, uri, data):
    with session.open(uri, "wb") as f:
        assert f.write(data) == len(data)
    assert session.stat(uri)["size"] == len(data)
    assert session.read(uri) == data
    buf = bytearray(len(data))
    assert session.read_into(uri, buf) == len(data)
    assert bytes(buf) == data
    with session.open(uri, "rb") as f:
        f.seek(len(data) // 2)
        assert f.read(100) == data[len(data) // 2: len(data) // 2 + 100]
        f.seek(-10, os.SEEK_END)
        assert f.read() == data[-10:]


def test_roundtrip_local_file(session, tmp_path):
    roundtrip(session, str(tmp_path / "x.bin"), pattern(3 * MIB + 17))
    roundtrip(session, "file://" + str(tmp_path / "y.bin"), pattern(50))


def test_roundtrip_memory_store(session):
    roundtrip(session, "mem://py/a/b.bin", pattern(MIB + 1))


def test_roundtrip_s3(s3):
    data = pattern(9 * MIB + 3)
    roundtrip(s3, "s3://test/py/obj.bin", data)
    listed = s3.ls("s3://test/py/")
    assert [o["key"] for o in listed] == ["py/obj.bin"]
    assert listed[0]["size"] == len(data)


def test_reads_through_the_embedded_cache(s3):
    data = pattern(3 * MIB)
    s3.write("s3://test/cached.bin", data)
    buf = bytearray(len(data))
    assert s3.read_into("cache+s3://test/cached.bin", buf) == len(data)
    assert bytes(buf) == data
    assert s3.read_into("s3://test/cached.bin", buf, cache=True) == len(data)
    assert os.listdir(s3.cache_directory), "the embedded cache kept nothing"


def test_reads_through_sluiced(s3server, daemon, tmp_path):
    s = sluice.connect(home=str(tmp_path / "home"), daemon=daemon.socket,
                       endpoint_url=s3server.endpoint)
    assert s.cache == "sluiced" and s.cache_socket == daemon.socket
    data = pattern(4 * MIB + 5, seed=3)
    s.write("s3://test/via-daemon.bin", data)
    buf = np.empty(len(data), dtype=np.uint8)
    assert s.read_into("cache+s3://test/via-daemon.bin", buf) == len(data)
    assert buf.tobytes() == data
    with s.open("cache+s3://test/via-daemon.bin") as f:
        assert f.read() == data


def test_connect_says_which_cache(tmp_path):
    s = sluice.connect(home=str(tmp_path / "h"))
    assert s.cache == "embedded"
    assert "no sluiced answers" in s.cache_reason
    off = sluice.connect(home=str(tmp_path / "h"), daemon="none")
    assert off.cache == "embedded" and "turned off" in off.cache_reason
    assert sluice.connect() is sluice.connect()  # the default session is made once


def test_zero_copy_into_numpy_tensor_bytearray_memoryview(session, tmp_path):
    data = pattern(2 * MIB)
    path = str(tmp_path / "z.bin")
    session.write(path, data)
    arr = np.zeros(len(data), dtype=np.uint8)
    addr = arr.ctypes.data
    assert session.read_into(path, arr) == len(data)
    assert arr.ctypes.data == addr and arr.tobytes() == data
    t = torch.zeros(len(data) // 4, dtype=torch.float32)
    ptr = t.data_ptr()
    assert session.read_into(path, t) == len(data)
    assert t.data_ptr() == ptr
    assert t.numpy().tobytes() == data
    ba = bytearray(len(data))
    view = memoryview(ba)[MIB:]
    assert session.read_into(path, view, offset=MIB) == MIB
    assert bytes(ba[MIB:]) == data[MIB:] and ba[:MIB] == bytearray(MIB)


def test_zero_copy_fills_the_callers_address(session, tmp_path):
    """The core reads into the very memory given: a numpy view into a larger array gets the
    bytes at its place, and the bytes around it are untouched."""
    data = pattern(MIB)
    path = str(tmp_path / "w.bin")
    session.write(path, data)
    big = np.full(3 * MIB, 7, dtype=np.uint8)
    session.read_into(path, big[MIB: 2 * MIB])
    assert big[MIB: 2 * MIB].tobytes() == data
    assert (big[:MIB] == 7).all() and (big[2 * MIB:] == 7).all()


def test_every_exception_class(session, tmp_path):
    with pytest.raises(sluice.NotFound) as e:
        session.stat(str(tmp_path / "missing"))
    assert isinstance(e.value, FileNotFoundError) and e.value.code == "not_found"
    assert "missing" in str(e.value)
    with pytest.raises(sluice.InvalidArgument):
        session.open("s3://", "rb")
    with pytest.raises(sluice.InvalidArgument):
        session.open(str(tmp_path / "x"), "r")
    with pytest.raises(sluice.InvalidArgument):
        session.open(str(tmp_path / "x"), "a+")
    session.write("mem://ex/k", b"1")
    with pytest.raises(sluice.AlreadyExists) as e:
        session.write("mem://ex/k", b"2", overwrite=False)
    assert isinstance(e.value, FileExistsError)
    for cls in (sluice.NotFound, sluice.InvalidArgument, sluice.IoError, sluice.Corruption,
                sluice.NoSpace, sluice.QuotaExceeded, sluice.Unavailable, sluice.Unsupported,
                sluice.PermissionDenied, sluice.AlreadyExists, sluice.Cancelled, sluice.TimedOut,
                sluice.Conflict, sluice.InternalError):
        with pytest.raises(cls) as e:
            sluice._core._raise(cls.code, "why")
        assert isinstance(e.value, sluice.Error) and str(e.value) == "why"
        assert e.value.code == cls.code


def test_bad_buffers_raise_and_read_nothing(session, tmp_path):
    path = str(tmp_path / "b.bin")
    session.write(path, pattern(4096))
    with pytest.raises(sluice.InvalidArgument, match="read-only"):
        session.read_into(path, b"\0" * 4096)
    with pytest.raises(sluice.InvalidArgument, match="not C-contiguous"):
        session.read_into(path, np.zeros((64, 64), dtype=np.uint8)[:, ::2])
    with pytest.raises(sluice.InvalidArgument, match="not contiguous"):
        session.read_into(path, torch.zeros(64, 64, dtype=torch.uint8).t())
    with pytest.raises(sluice.InvalidArgument, match="not a buffer"):
        session.read_into(path, 12345)
    with pytest.raises(sluice.InvalidArgument, match="below 0"):
        session.read_into(path, bytearray(10), offset=-1)
    f = session.open(path, "rb", buffering=0)
    f.close()
    with pytest.raises(ValueError):
        f.readinto(bytearray(10))
    w = session.open(str(tmp_path / "closed.bin"), "wb")
    w.close()
    with pytest.raises(ValueError):
        w.write(b"x")


def test_a_buffer_larger_than_the_object_gets_what_is_there(session, tmp_path):
    path = str(tmp_path / "s.bin")
    session.write(path, b"abc")
    buf = bytearray(b"zzzzzz")
    assert session.read_into(path, buf) == 3
    assert bytes(buf) == b"abczzz"
    assert session.read_into(path, buf, offset=3) == 0


def test_writes_are_atomic(session, tmp_path):
    path = tmp_path / "atomic.bin"
    with pytest.raises(KeyError):
        with session.open(str(path), "wb") as f:
            f.write(pattern(MIB))
            raise KeyError("stop")
    assert not path.exists()
    f = session.open(str(path), "wb")
    f.write(b"half")
    del f  # dropped unclosed: nothing is published
    assert not path.exists()
    assert not [p for p in os.listdir(tmp_path) if "atomic" in p]
    f = session.open(str(path), "wb")
    f.write(b"x")
    f.abort()
    assert not path.exists()
    session.write(str(path), b"old")
    with pytest.raises(RuntimeError):
        with session.open(str(path), "wb") as f:
            f.write(b"new and longer")
            raise RuntimeError
    assert path.read_bytes() == b"old"


def test_a_changed_object_is_a_conflict(s3):
    s3.write("s3://test/changing.bin", pattern(2 * MIB, seed=5))
    f = s3.open("s3://test/changing.bin", "rb", buffering=0)
    f.read(10)
    s3.write("s3://test/changing.bin", pattern(2 * MIB, seed=6))
    with pytest.raises(sluice.Conflict):
        f.read(MIB)


def test_copy_and_ls(session, tmp_path):
    src = tmp_path / "tree"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_bytes(b"a")
    (src / "sub" / "b.txt").write_bytes(b"bb")
    summary = session.copy(str(src), "mem://cp/tree/", recursive=True)
    assert summary["objects"] == 2 and summary["bytes"] == 3
    assert [o["key"] for o in session.ls("mem://cp/tree/", recursive=True)] == [
        "tree/a.txt", "tree/sub/b.txt"]
    assert [o["key"] for o in session.ls("mem://cp/tree/")] == ["tree/a.txt", "tree/sub/"]
    with pytest.raises(sluice.InvalidArgument):
        session.copy(str(src), "mem://cp/x")  # a directory, not recursive
    with pytest.raises(sluice.NotFound):
        session.copy(str(tmp_path / "nothing"), "mem://cp/y")


def test_the_gil_is_released_during_a_long_read(s3):
    data = pattern(48 * MIB, seed=9)
    s3.write("s3://test/long.bin", data)
    buf = bytearray(len(data))
    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.001)

    t = threading.Thread(target=ticker)
    t.start()
    time.sleep(0.01)
    start = time.monotonic()
    s3.read_into("s3://test/long.bin", buf)
    end = time.monotonic()
    stop.set()
    t.join()
    during = [x for x in ticks if start < x < end]
    # A read that held the GIL would let the ticker run at most once or twice.
    assert len(during) >= 5, f"{len(during)} ticks in a {end - start:.3f} s read"
    assert hashlib.sha256(buf).digest() == hashlib.sha256(data).digest()


def test_a_raw_address_is_not_a_buffer(session):
    # Issue 47, item 3: a bare (address, nbytes) tuple named process memory. Read into, it
    # crashed the process; written, it published whatever lay there as an object.
    import ctypes

    session.write("mem://raw/a", b"0123456789abcdef")
    secret = ctypes.create_string_buffer(b"secret process memory", 24)
    with pytest.raises(sluice.InvalidArgument, match="tuple is not a buffer"):
        session.read_into("mem://raw/a", (4096, 16))
    with pytest.raises(sluice.InvalidArgument, match="tuple is not a buffer"):
        session.write("mem://raw/b", (ctypes.addressof(secret), 24))
    with pytest.raises(sluice.InvalidArgument, match="tuple is not a buffer"):
        with session.open("mem://raw/c", "wb") as w:
            w.write((ctypes.addressof(secret), 24))
    # A tensor subclass that lies about its address and size lends its own bytes only.
    class Liar(torch.Tensor):
        def data_ptr(self):
            return ctypes.addressof(secret)

        def numel(self):
            return 1 << 20

    liar = torch.Tensor._make_subclass(Liar, torch.full((4,), 7, dtype=torch.uint8))
    session.write("mem://liar/f", liar)
    assert session.read("mem://liar/f") == bytes([7, 7, 7, 7])
    # Nor is a span of the package's own, built by the caller.
    with pytest.raises(sluice.InvalidArgument, match="raw span is not a buffer"):
        session.write("mem://raw/e", sluice._core._RawSpan(ctypes.addressof(secret), 24))
    assert [o["key"] for o in session.ls("mem://raw/")] == ["a"]
    # What the public calls take: the buffer protocol, and tensors.
    t = torch.zeros(16, dtype=torch.uint8)
    assert session.read_into("mem://raw/a", t) == 16
    assert bytes(t.numpy()) == b"0123456789abcdef"
    session.write("mem://raw/d", torch.arange(4, dtype=torch.uint8))
    assert session.read("mem://raw/d") == bytes([0, 1, 2, 3])


def test_out_of_range_integers_name_the_argument(session):
    # Issue 47, item 10: pybind11 answered these with "incompatible function arguments".
    session.write("mem://ints/a", b"x" * 8)
    for bad in (2**64, -1, 1.5, True):
        with pytest.raises(sluice.InvalidArgument, match="offset"):
            session.read_into("mem://ints/a", bytearray(4), offset=bad)


def _folder_with_a_link_out(tmp_path):
    (tmp_path / "secret").write_bytes(b"not yours")
    shared = tmp_path / "shared"
    (shared / "sub").mkdir(parents=True)
    (shared / "a.bin").write_bytes(b"a" * 10)
    (shared / "sub" / "b.bin").write_bytes(b"b" * 20)
    os.symlink(tmp_path / "secret", shared / "sub" / "evil.bin")
    return shared


def test_a_link_out_of_a_folder_is_skipped_and_named(session, tmp_path):
    # Issue 47, item 9: one symlink out of a shared folder made ls and a recursive copy of
    # the whole folder fail, for every team. It is left out, and a SkippedWarning names it.
    shared = _folder_with_a_link_out(tmp_path)
    with pytest.warns(sluice.SkippedWarning, match="evil.bin"):
        keys = [o["key"] for o in session.ls(str(shared), recursive=True)]
    assert keys == ["a.bin", "sub/b.bin"]
    with pytest.warns(sluice.SkippedWarning, match="evil.bin"):
        summary = session.copy(str(shared) + "/", "mem://links/", recursive=True)
    assert summary["objects"] == 2 and [k for k, _ in summary["skipped"]] == ["sub/evil.bin"]
    assert session.read("mem://links/sub/b.bin") == b"b" * 20
    with pytest.raises(sluice.InvalidArgument, match="outside the store"):
        session.read(str(shared / "sub" / "evil.bin"))


def test_a_link_out_of_a_folder_is_skipped_through_sluiced(s3server, daemon, tmp_path):
    shared = _folder_with_a_link_out(tmp_path)
    s = sluice.connect(home=str(tmp_path / "home"), daemon=daemon.socket,
                       endpoint_url=s3server.endpoint)
    with pytest.warns(sluice.SkippedWarning, match="evil.bin"):
        keys = [o["key"] for o in s.ls(f"cache+file://{shared}", recursive=True)]
    assert [k.split("/shared/", 1)[-1] for k in keys] == ["a.bin", "sub/b.bin"]  # the daemon's
    # keys are relative to its own root
