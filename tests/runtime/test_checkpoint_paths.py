"""Saves respect the path they are given (pock_save in checkpoint.cpp, checkpoint.write_checkpoint,
trainer.save(trained_only=True), pock_save_trained in trained_ckpt.cpp: one atomic writer each side): a symbolic link is saved through (its target replaced, the
link kept), a device, FIFO or directory is refused and left as it was, a legal long name
(up to NAME_MAX) saves, and loading a FIFO is refused at once instead of blocking."""
import ctypes
import os
import stat
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from pockengine.build.host import build_shared_library
from pockengine.runtime.checkpoint import read_checkpoint, write_checkpoint
from pockengine.errors import PockError
from pockengine.runtime.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "native" / "runtime" / "fixtures" / "tiny_model.cpp"
WRITERS = ["pock_save", "write_checkpoint", "trained_only", "pock_save_trained"]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    # fc.bias trained: the C writer of trained-only files (pock_save_trained) needs the table
    return build_shared_library([TINY], tmp_path_factory.mktemp("tiny"), ["-DTINY_TRAINED"], kernels=False)


@pytest.fixture
def trainer(lib):
    with Trainer(lib) as t:
        t.trained_names = ["fc.bias"]  # what prog.build() sets: for save(trained_only=True)
        rng = np.random.default_rng(0)
        t.step((rng.standard_normal((4, 3)).astype(np.float32), rng.integers(0, 5, size=4)),
               (rng.standard_normal((4, 2)).astype(np.float32),))
        yield t


def save(t, path, how):
    if how == "pock_save":
        t.save(path)
    elif how == "trained_only":
        t.save(path, trained_only=True)
    elif how == "pock_save_trained":  # the C writer the SDKs call for save(trainedOnly)
        t._lib.pock_save_trained.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        t._check(t._lib.pock_save_trained(t._live(), os.fsencode(path)))
    else:
        blob = Path(path).parent / "via-python.src"
        t.save(blob)
        ckpt = read_checkpoint(blob)
        blob.unlink()
        write_checkpoint(path, ckpt)


def loads_back(t, path):
    before = t.get_tensor("fc.bias").copy()
    t.set_tensor("fc.bias", np.zeros_like(before))
    t.load(path)
    return np.array_equal(t.get_tensor("fc.bias"), before) and t.step_count == 1


@pytest.mark.parametrize("how", WRITERS)
def test_a_symlink_is_saved_through_and_kept(trainer, tmp_path, how):
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "weights.pock"
    target.write_bytes(b"the previous checkpoint")
    link = tmp_path / "latest.pock"
    link.symlink_to(os.path.join("real", "weights.pock"))  # relative, as users make them
    save(trainer, link, how)
    assert link.is_symlink() and os.readlink(link) == os.path.join("real", "weights.pock")
    assert target.read_bytes() != b"the previous checkpoint" and stat.S_ISREG(target.lstat().st_mode)
    assert loads_back(trainer, link)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.pock", "real"]
    assert [p.name for p in (tmp_path / "real").iterdir()] == ["weights.pock"]  # no temporary left


@pytest.mark.parametrize("how", WRITERS)
def test_a_dangling_symlink_creates_its_target(trainer, tmp_path, how):
    link = tmp_path / "next.pock"
    link.symlink_to(tmp_path / "new.pock")
    save(trainer, link, how)
    assert link.is_symlink() and (tmp_path / "new.pock").is_file()
    assert loads_back(trainer, link)


def _special(tmp_path: Path, kind: str) -> Path:
    p = tmp_path / f"special-{kind}"
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "directory":
        p.mkdir()
    elif kind == "device":  # a null device of our own: never the system's /dev/null
        try:
            os.mknod(p, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("mknod needs CAP_MKNOD")
    return p


@pytest.mark.parametrize("how", WRITERS)
@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_a_non_regular_file_is_refused_and_left_alone(trainer, tmp_path, how, kind):
    p = _special(tmp_path, kind)
    mode = p.lstat().st_mode
    with pytest.raises(PockError, match="not a regular file"):
        save(trainer, p, how)
    assert p.lstat().st_mode == mode  # still the FIFO / directory / device
    link = tmp_path / "link-to-special"
    link.symlink_to(p)
    with pytest.raises(PockError, match="not a regular file"):
        save(trainer, link, how)
    assert p.lstat().st_mode == mode and link.is_symlink()
    assert sorted(x.name for x in tmp_path.iterdir()) == ["link-to-special", p.name]


@pytest.mark.parametrize("how", WRITERS)
@pytest.mark.parametrize("length", [233, 255])
def test_a_long_legal_name_saves(trainer, tmp_path, how, length):
    path = tmp_path / ("c" * (length - 5) + ".pock")
    assert len(path.name) == length
    save(trainer, path, how)
    assert loads_back(trainer, path)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


@pytest.mark.parametrize("reader", ["load", "read_checkpoint"])
def test_loading_a_fifo_is_refused_at_once(trainer, tmp_path, reader):
    fifo = tmp_path / "pipe.pock"
    os.mkfifo(fifo)
    done = threading.Event()

    def unblock():  # before the fix each open waited for a writer: give it one every 5 s
        while not done.wait(5):
            os.close(os.open(fifo, os.O_RDWR))

    threading.Thread(target=unblock, daemon=True).start()
    start = time.monotonic()
    try:
        with pytest.raises(PockError, match="FIFO, not a regular file"):
            trainer.load(fifo) if reader == "load" else read_checkpoint(fifo)
    finally:
        done.set()
    assert time.monotonic() - start < 2


def test_loading_a_device_is_refused(trainer, tmp_path):
    dev = _special(tmp_path, "device")
    with pytest.raises(PockError, match="not a regular file"):
        trainer.load(dev)
