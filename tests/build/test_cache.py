"""The build cache verifies and heals itself (build/cache.py, build/host.py): a truncated,
zeroed, bit-flipped, zero-byte or random library in lib/ or models/, or an emptied object,
is reported (a warning naming the file), discarded and rebuilt; a full or read-only cache
names the file that failed; temporary files of dead processes are removed.

Each build + load of a damaged cache runs in a child process: before these checks a
damaged library crashed the process that loaded it (SIGBUS, SIGSEGV, SIGILL)."""
from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from pockengine.build import cache, host
from pockengine.errors import PockError

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "native" / "runtime" / "fixtures" / "tiny_model.cpp"

# dlopen a library and open a trainer on it, in a child process (a damaged library may crash it)
CHILD = """
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.pock_model_name.restype = ctypes.c_char_p
t = ctypes.c_void_p()
assert lib.pock_open(None, ctypes.byref(t)) == 0
lib.pock_close(t)
print("LOADED", lib.pock_model_name().decode())
"""


class Built:
    def __init__(self, lib, warns, child):
        self.lib, self.warnings, self.child = lib, warns, child
        self.returncode, self.stdout = child.returncode, child.stdout
        self.stderr = child.stderr + "".join(f"\n{w.category.__name__}: {w.message}" for w in warns)


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """A cache holding the tiny model's objects and library (built once, copied per test)."""
    d = tmp_path_factory.mktemp("warm")
    out = _build(d)
    assert out.returncode == 0, out.stderr
    return d


@pytest.fixture
def cdir(warm, tmp_path, monkeypatch):
    d = tmp_path / "cache"
    shutil.copytree(warm, d)
    monkeypatch.setenv("POCK_CACHE_DIR", str(d))
    return d


def _build(cache_root: Path) -> Built:
    """Build the tiny model into cache_root (in this process: building never loads the library),
    then load it in a child process."""
    old = os.environ.get("POCK_CACHE_DIR")
    os.environ["POCK_CACHE_DIR"] = str(cache_root)
    try:
        with warnings.catch_warnings(record=True) as warns:
            warnings.simplefilter("always")
            lib = host.build_shared_library([TINY], cache_root / "models", kernels=False)
    finally:
        if old is None:
            del os.environ["POCK_CACHE_DIR"]
        else:
            os.environ["POCK_CACHE_DIR"] = old
    child = subprocess.run([sys.executable, "-c", CHILD, str(lib)], capture_output=True, text=True, timeout=60)
    return Built(lib, warns, child)


def _entries(d: Path, sub: str, suffix: str) -> list[Path]:
    return sorted(p for p in (d / sub).iterdir() if p.name.endswith(suffix))


def _damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncate":
        data = data[: len(data) // 2]
    elif how == "zero":
        data = bytearray(len(data))
    elif how == "flip":  # a bit in the middle of the code
        data[len(data) // 2] ^= 0x10
    elif how == "empty":
        data = bytearray()
    elif how == "random":
        data = bytearray(os.urandom(len(data)))
    os.chmod(path, 0o644)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("where", ["lib", "models"])
@pytest.mark.parametrize("how", ["truncate", "zero", "flip", "empty", "random"])
def test_a_damaged_library_is_reported_discarded_and_rebuilt(cdir, where, how):
    (lib,) = _entries(cdir, where, ".so")
    good = lib.read_bytes()
    _damage(lib, how)
    out = _build(cdir)
    assert out.returncode == 0, f"exit {out.returncode}: {out.stderr[-2000:]}"
    assert "LOADED tiny" in out.stdout
    assert "RuntimeWarning" in out.stderr and lib.name in out.stderr and "damaged" in out.stderr + "differs", \
        out.stderr
    assert lib.read_bytes() == good  # healed: the same bytes as before the damage
    again = _build(cdir)  # and healed for good: no warning the next time
    assert again.returncode == 0 and "RuntimeWarning" not in again.stderr, again.stderr


def test_a_bad_lib_entry_is_never_copied_into_models(cdir):
    (lib,) = _entries(cdir, "lib", ".so")
    (copy,) = _entries(cdir, "models", ".so")
    good = copy.read_bytes()
    copy.unlink()
    _damage(lib, "flip")
    out = _build(cdir)
    assert out.returncode == 0 and "LOADED tiny" in out.stdout, out.stderr[-2000:]
    assert copy.read_bytes() == good and lib.read_bytes() == good


def test_an_emptied_model_object_is_rebuilt_not_linked(cdir):
    (obj,) = [p for p in _entries(cdir, "obj", ".o") if p.name.startswith("tiny_model-")]
    for p in [*_entries(cdir, "lib", ".so"), *_entries(cdir, "models", ".so")]:
        p.unlink()  # force a new link: it must not take the emptied object
    _damage(obj, "empty")
    out = _build(cdir)
    assert out.returncode == 0 and "LOADED tiny" in out.stdout, out.stderr[-2000:]
    assert obj.name in out.stderr and obj.stat().st_size > 0


def test_a_library_without_the_model_is_never_cached(cdir, tmp_path):
    empty = tmp_path / "empty.cpp"
    empty.write_text("// no model here\n")
    with pytest.raises(PockError, match="pock_compiled_model is undefined"):
        host.build_shared_library([empty], tmp_path / "out", kernels=False)
    assert not [p for p in (cdir / "lib").iterdir() if p.name.startswith("empty-") and p.suffix != ".lock"]


def test_temporary_files_of_dead_processes_are_removed(cdir):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = [cdir / "lib" / f"tiny_model-x.so.tmp-{dead.pid}", cdir / "models" / f"libtiny-x.so.tmp-{dead.pid}"]
    for p in stale:
        p.write_bytes(b"half a library")
    (lib,) = _entries(cdir, "lib", ".so")
    lib.unlink()  # a rebuild scans lib/ ...
    for p in _entries(cdir, "models", ".so"):
        p.unlink()  # ... and a copy scans models/
    out = _build(cdir)
    assert out.returncode == 0, out.stderr[-2000:]
    assert not any(p.exists() for p in stale)


def test_a_full_cache_names_the_file_that_failed(cdir, tmp_path, monkeypatch):
    for p in _entries(cdir, "models", ".so"):
        p.unlink()
    real = shutil.copyfile

    def full(src, dst, *a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))

    monkeypatch.setattr(shutil, "copyfile", full)
    with pytest.raises(PockError) as e:
        host.build_shared_library([TINY], cdir / "models", kernels=False)
    msg = str(e.value)
    assert "No space left on device" in msg and "POCK_CACHE_DIR" in msg
    assert ".tmp-" in msg and "models" in msg  # the copy that failed, not the intact lib/ entry
    assert [p for p in (cdir / "models").iterdir() if ".tmp-" in p.name] == []
    monkeypatch.setattr(shutil, "copyfile", real)
    assert host.build_shared_library([TINY], cdir / "models", kernels=False).exists()


def test_a_failed_store_names_the_entry_and_leaves_no_temporary(cdir, monkeypatch):
    (lib,) = _entries(cdir, "lib", ".so")
    lib.unlink()
    real = os.fsync

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(PockError, match=r"cannot write the build cache file .*tiny_model-.*\.so\.tmp-.*No space left"
                                        r".*POCK_CACHE_DIR"):
        host.build_shared_library([TINY], cdir / "models", kernels=False)
    monkeypatch.setattr(os, "fsync", real)
    assert [p for p in (cdir / "lib").iterdir() if ".tmp-" in p.name] == []


def test_a_read_only_cache_names_the_directory(cdir, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")  # root ignores permissions; a file in the path stops anyone
    monkeypatch.setenv("POCK_CACHE_DIR", str(blocker / "cache"))
    with pytest.raises(PockError, match=r"cannot write the build cache file .*file.*POCK_CACHE_DIR"):
        host.build_shared_library([TINY], tmp_path / "out", kernels=False)


def test_entries_carry_their_digest(cdir):
    for sub, suffix in (("lib", ".so"), ("obj", ".o")):
        for p in _entries(cdir, sub, suffix):
            assert cache.stored_digest(p) == cache.file_digest(p)
