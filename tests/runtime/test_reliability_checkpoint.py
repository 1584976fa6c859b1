"""Checkpoint faults (issue 13, classes 3 and 4), on the hand-written tiny model:
concurrent saves to one path, temp files orphaned by a crash, and a loader that
checks every header field and the file's size before it reads."""
import os
import resource
import struct
import subprocess
import sys
import threading
import zlib
from pathlib import Path

import numpy as np
import pytest

from pockengine.build.host import build_shared_library
from pockengine.runtime.checkpoint import read_checkpoint, write_checkpoint
from pockengine.errors import PockError
from pockengine.runtime.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "native" / "runtime" / "fixtures" / "tiny_model.cpp"


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return build_shared_library([TINY], tmp_path_factory.mktemp("tiny"), kernels=False)


def batch(seed):
    rng = np.random.default_rng(seed)
    return ((rng.standard_normal((4, 3)).astype(np.float32), rng.integers(0, 5, size=4)),
            (rng.standard_normal((4, 2)).astype(np.float32),))


def snapshot(t):
    return {x.name: t.get_tensor(x.name) for x in t.tensors}, t.step_count, t.learning_rate


def same(a, b):
    return a[1:] == b[1:] and all(np.array_equal(a[0][k], b[0][k]) for k in a[0])


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


# ---------------------------------------------------------------------- 3. concurrent saves
def test_concurrent_saves_to_one_path_leave_one_whole_checkpoint(lib, tmp_path):
    a, b = Trainer(lib), Trainer(lib)
    a.step(*batch(0))
    for _ in range(3):
        b.step(*batch(1))
    path = tmp_path / "shared.pock"
    states = {1: snapshot(a), 3: snapshot(b)}
    errors = []

    def save(t, n):
        try:
            for _ in range(n):
                t.save(path)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    for _ in range(40):
        threads = [threading.Thread(target=save, args=(t, 5)) for t in (a, b, a, b)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not errors, errors
        ckpt = read_checkpoint(path)  # whole: magic, CRC, every tensor
        with Trainer(lib, checkpoint=path) as c:
            assert same(snapshot(c), states[ckpt.step])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shared.pock"]


@pytest.mark.parametrize("writer", ["runtime", "python"])
def test_orphaned_temp_files_are_removed_by_the_next_save(lib, tmp_path, writer):
    path = tmp_path / "ckpt.pock"
    pid = dead_pid()
    orphans = [tmp_path / f"ckpt.pock.tmp-{pid}", tmp_path / f"ckpt.pock.tmp-{pid}-0-0123456789abcdef"]
    live = tmp_path / f"ckpt.pock.tmp-{os.getpid()}-99-feedfeedfeedfeed"  # a save in progress: kept
    others = [tmp_path / f"other.pock.tmp-{pid}", tmp_path / f"ckpt.pock.tmp-x{pid}"]  # not ours
    for p in orphans + [live] + others:
        p.write_bytes(b"partial checkpoint")
    with Trainer(lib) as t:
        if writer == "runtime":
            t.save(path)
        else:
            t.save(tmp_path / "seed.pock")
            write_checkpoint(path, read_checkpoint(tmp_path / "seed.pock"))
            (tmp_path / "seed.pock").unlink()
        t.load(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([path.name, live.name] + [p.name for p in others])


# ---------------------------------------------------------------------- 4. load checks the header
def rewrite_header(blob: bytes, step=None, lr=None) -> bytes:
    """blob with another step count / learning rate and a valid CRC."""
    body = bytearray(blob[:-4])
    (n,) = struct.unpack_from("<I", body, 12)
    pos = 16 + n
    if step is not None:
        struct.pack_into("<q", body, pos, step)
    if lr is not None:
        struct.pack_into("<f", body, pos + 8, lr)
    return bytes(body) + struct.pack("<I", zlib.crc32(bytes(body)))


@pytest.mark.parametrize("field, value, message", [
    ("lr", float("nan"), "learning rate nan is not finite and >= 0"),
    ("lr", float("inf"), "learning rate inf is not finite and >= 0"),
    ("lr", -0.5, "learning rate -0.5 is not finite"),
    ("step", 2**63 - 1, r"step count 9223372036854775807 is outside \[0, 2\^53\]"),
    ("step", 2**53 + 1, "step count 9007199254740993 is outside"),
    ("step", -1, "step count -1 is outside"),
])
def test_load_rejects_bad_header_fields(lib, tmp_path, field, value, message):
    with Trainer(lib) as t:
        t.step(*batch(0))
        good = tmp_path / "good.pock"
        t.save(good)
        bad = tmp_path / "bad.pock"
        bad.write_bytes(rewrite_header(good.read_bytes(), **{field: value}))
        t.step(*batch(1))
        before = snapshot(t)
        with pytest.raises(PockError, match=message):
            t.load(bad)
        assert same(snapshot(t), before)
        with pytest.raises(PockError, match=message):
            Trainer(lib, checkpoint=bad)
        ok = tmp_path / "ok.pock"
        ok.write_bytes(rewrite_header(good.read_bytes(), step=2**53, lr=0.0))  # the edges are valid
        t.load(ok)
        assert t.step_count == 2**53 and t.learning_rate == 0.0


def test_load_checks_the_size_before_reading(lib, tmp_path):
    with Trainer(lib) as t:
        good = tmp_path / "good.pock"
        t.save(good)
        huge = tmp_path / "huge.pock"
        huge.write_bytes(good.read_bytes())
        with open(huge, "r+b") as f:
            f.truncate(1 << 30)  # 1 GiB, sparse: costs no disk, but a reader would hold it all in memory
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
        with pytest.raises(PockError, match=r"is corrupt or truncated: 1073741824 bytes, model .tiny. needs \d+"):
            t.load(huge)
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100 * 1024
        t.load(good)


def test_python_reader_checks_the_header_too(lib, tmp_path):
    with Trainer(lib) as t:
        t.save(tmp_path / "good.pock")
    blob = (tmp_path / "good.pock").read_bytes()
    for kw, message in [({"lr": float("nan")}, "learning rate nan"), ({"step": 2**63 - 1}, "step count")]:
        (tmp_path / "bad.pock").write_bytes(rewrite_header(blob, **kw))
        with pytest.raises(PockError, match=message):
            read_checkpoint(tmp_path / "bad.pock")
