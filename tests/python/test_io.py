"""sluice.io.File: positional reads and writes into host buffers, futures, the batch call,
path reports, bad input."""

import numpy as np
import pytest
import torch

import sluice
import sluice.io

MIB = 1 << 20


def test_pread_pwrite_read_write_and_batch(tmp_path):
    path = str(tmp_path / "f.bin")
    data = np.random.default_rng(0).integers(0, 256, 4 * MIB, dtype=np.uint8)
    with sluice.io.File(path, "w") as f:
        assert f.pwrite(data).get() == 4 * MIB
        f.sync()
        assert f.size == 4 * MIB
    with sluice.io.File(path, "r") as f:
        t = torch.empty(4 * MIB, dtype=torch.uint8)
        fut = f.pread(t)
        assert fut.get() == 4 * MIB and fut.done()
        assert t.numpy().tobytes() == data.tobytes()
        buf = bytearray(100)
        assert f.read(buf, 50, file_offset=MIB + 3, buf_offset=10) == 50
        assert bytes(buf[10:60]) == data[MIB + 3: MIB + 53].tobytes()
        parts = [np.empty(MIB, dtype=np.uint8) for _ in range(4)]
        got = f.batch([("read", p, None, i * MIB) for i, p in enumerate(reversed(parts))])
        assert got == [MIB] * 4
        assert b"".join(p.tobytes() for p in reversed(parts)) == data.tobytes()
        report = f.path_report()
        assert report["engine"] in ("io_uring", "thread-pool") and report["why"]


def test_path_report_says_which_path_and_why(tmp_path):
    (tmp_path / "x").write_bytes(b"x" * 4096)
    r = sluice.io.path_report(str(tmp_path / "x"))
    assert r["path"] in ("gds", "bounce", "host") and r["why"]
    if not torch.cuda.is_available():
        assert r["path"] == "host" and not r["cuda"]


def test_bad_input(tmp_path):
    path = str(tmp_path / "g.bin")
    with pytest.raises(sluice.NotFound):
        sluice.io.File(str(tmp_path / "none"), "r")
    with pytest.raises(sluice.InvalidArgument, match="flags"):
        sluice.io.File(path, "rw")
    with sluice.io.File(path, "w") as f:
        f.write(b"abc")
        with pytest.raises(sluice.InvalidArgument, match="do not fit"):
            f.read(bytearray(4), size=8)
        with pytest.raises(sluice.InvalidArgument, match="past the buffer"):
            f.read(bytearray(4), buf_offset=5)
        with pytest.raises(sluice.InvalidArgument, match="read-only"):
            f.read(b"1234")
        with pytest.raises(sluice.InvalidArgument, match="not contiguous"):
            f.read(torch.zeros(8, 8).t())
        with pytest.raises(sluice.InvalidArgument, match="op"):
            f.batch([("copy", bytearray(1), None, 0)])
    with pytest.raises(sluice.InvalidArgument, match="closed"):
        f.read(bytearray(1))
    # A future dropped early, and a close while it is in flight: the read finishes into
    # memory that is still there.
    big = tmp_path / "big.bin"
    big.write_bytes(b"z" * (8 << 20))
    g = sluice.io.File(str(big), "r")
    fut = g.pread(bytearray(8 << 20))
    g.close()
    del fut
    h = sluice.io.File(str(big), "r")
    buf = bytearray(8 << 20)
    fut = h.pread(buf)
    h.close()
    assert fut.get() == 8 << 20 and buf[-1:] == b"z"


def test_out_of_range_integers_name_the_argument(tmp_path):
    # Issue 47, item 10: a negative offset reached pybind11 as "incompatible function
    # arguments"; each call now names the argument, before any I/O.
    path = str(tmp_path / "f")
    with sluice.io.File(path, "w") as f:
        f.write(bytearray(8192))
    buf = bytearray(4096)
    with sluice.io.File(path, "r") as f:
        for call in (f.pread, f.read):
            with pytest.raises(sluice.InvalidArgument, match="file_offset"):
                call(buf, file_offset=-5)
            with pytest.raises(sluice.InvalidArgument, match="size"):
                call(buf, size=2**64)
            with pytest.raises(sluice.InvalidArgument, match="buf_offset"):
                call(buf, buf_offset=-1)
        with pytest.raises(sluice.InvalidArgument, match="file_offset"):
            f.batch([("read", buf, None, -5)])
        with pytest.raises(sluice.InvalidArgument, match="tuple is not a buffer"):
            f.read((id(buf), 16))
        assert f.read(buf, file_offset=4096) == 4096
