"""The build cache's integrity: every entry verified before it is used.

An entry (an object, a library, a copy of a library in models/) is stored with
its SHA-256 in a sidecar `<entry>.sha256`.  Storing writes the entry under a
temporary name `<entry>.tmp-<pid>`, fsyncs it, writes the sidecar the same way,
renames the entry into place and fsyncs the directory, so a power loss leaves
either no entry or a whole one with its digest.  Before an entry is loaded
(dlopen) or copied, `entry_ok` checks it against its digest; a truncated,
zeroed, bit-flipped or otherwise damaged entry is reported (a RuntimeWarning
naming the file), discarded, and the caller rebuilds it.  Temporary files of
processes that no longer run are removed before a new entry is written.

A failed write (a full or read-only disk) raises PockError naming the file that
failed and what to do.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import warnings
from pathlib import Path

from ..errors import PockError

SIDECAR = ".sha256"
_TEMP = re.compile(r"\.tmp-(\d+)$")
_verified: dict[str, tuple] = {}  # path -> (inode, size, mtime_ns, digest) checked by this process


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sidecar(path: Path) -> Path:
    return path.with_name(path.name + SIDECAR)


def stored_digest(path: Path) -> str | None:
    """The digest recorded for the entry at path, or None when it has none."""
    try:
        text = sidecar(path).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if re.fullmatch(r"[0-9a-f]{64}", text) else None


def entry_ok(path: Path, warn: bool = True) -> bool:
    """Whether the entry at path exists and matches its recorded digest.  A damaged entry
    (no digest, or bytes that do not match it) is reported and discarded: False."""
    path = Path(path)
    try:
        st = path.stat()
    except OSError:
        return False
    stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
    want = stored_digest(path)
    seen = _verified.get(str(path))
    if want is not None and seen == (*stamp, want):
        return True
    if want is None:
        why = "it has no digest (an interrupted write?)"
    else:
        try:
            got = file_digest(path)
        except OSError as e:
            got, why = None, f"it cannot be read: {e.strerror}"
        if got == want:
            _verified[str(path)] = (*stamp, want)
            return True
        if got is not None:
            why = f"{st.st_size} bytes with SHA-256 {got[:16]}..., recorded {want[:16]}..."
    discard(path, why, warn)
    return False


def discard(path: Path, why: str, warn: bool = True) -> None:
    if warn:
        warnings.warn(f"pockengine: the build cache entry {str(path)!r} is damaged ({why}); discarding and "
                      f"rebuilding it", RuntimeWarning, stacklevel=3)
    _verified.pop(str(path), None)
    for p in (path, sidecar(path)):
        try:
            p.unlink()
        except FileNotFoundError:
            pass
        except OSError as e:
            raise write_failed(p, e) from None


def temp_name(path: Path) -> Path:
    return path.with_name(f"{path.name}.tmp-{os.getpid()}")


def remove_dead_temps(directory: Path) -> None:
    """Remove `*.tmp-<pid>` files whose process is gone (a build killed mid-write)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        m = _TEMP.search(name)
        if not m or int(m.group(1)) == os.getpid():
            continue
        try:
            os.kill(int(m.group(1)), 0)
            continue  # alive: maybe writing right now
        except ProcessLookupError:
            pass
        except (OSError, OverflowError):
            continue
        try:
            os.unlink(Path(directory) / name)
        except OSError:
            pass


def write_failed(path: Path, e: OSError) -> PockError:
    return PockError(f"cannot write the build cache file {str(path)!r}: {e.strerror or e} (is the disk full or the "
                     f"directory read-only? set POCK_CACHE_DIR to a writable directory with free space)")


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # not every filesystem syncs directories
    finally:
        os.close(fd)


def store(tmp: Path, target: Path) -> str:
    """Make the finished temporary file tmp the entry target: fsync it, record its digest
    (sidecar, written atomically), rename it into place, fsync the directory.  Returns the
    digest.  On failure both temporary files are removed and PockError names the file."""
    tmp, target = Path(tmp), Path(target)
    side, side_tmp = sidecar(target), temp_name(sidecar(target))
    current = tmp
    try:
        _fsync_file(tmp)
        digest = file_digest(tmp)
        current = side_tmp
        with open(side_tmp, "w") as f:
            f.write(digest + "\n")
            f.flush()
            os.fsync(f.fileno())
        current = side
        os.replace(side_tmp, side)
        current = target
        os.replace(tmp, target)
        _fsync_dir(target.parent)
    except OSError as e:
        for p in (tmp, side_tmp):
            p.unlink(missing_ok=True)
        raise write_failed(current, e) from None
    st = target.stat()
    _verified[str(target)] = (st.st_ino, st.st_size, st.st_mtime_ns, digest)
    return digest


def copy_ok(dest: Path, want: str) -> bool:
    """Whether dest (a copy of a cache entry, e.g. models/lib<model>-<key>.so) holds the bytes
    with digest want; a damaged copy is reported and removed: False."""
    dest = Path(dest)
    try:
        st = dest.stat()
    except OSError:
        return False
    stamp = (st.st_ino, st.st_size, st.st_mtime_ns, want)
    if _verified.get(str(dest)) == stamp:
        return True
    try:
        got = file_digest(dest)
    except OSError:
        got = None
    if got == want:
        _verified[str(dest)] = stamp
        return True
    warnings.warn(f"pockengine: the library {str(dest)!r} differs from its cache entry ({st.st_size} bytes, "
                  f"SHA-256 {(got or 'unreadable')[:16]}..., expected {want[:16]}...); replacing it",
                  RuntimeWarning, stacklevel=3)
    _verified.pop(str(dest), None)
    try:
        dest.unlink()
    except FileNotFoundError:
        pass
    except OSError as e:
        raise write_failed(dest, e) from None
    return False


def copy_entry(src: Path, dest: Path) -> str:
    """Copy src to dest atomically (temporary file, fsync, rename, directory fsync); returns
    the digest of what was copied (the caller compares it with src's recorded one)."""
    dest = Path(dest)
    tmp = temp_name(dest)
    current = dest.parent
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        remove_dead_temps(dest.parent)
        current = tmp
        shutil.copyfile(src, tmp)
        _fsync_file(tmp)
        digest = file_digest(tmp)
        current = dest
        os.replace(tmp, dest)
        _fsync_dir(dest.parent)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise write_failed(current, e) from None
    st = dest.stat()
    _verified[str(dest)] = (st.st_ino, st.st_size, st.st_mtime_ns, digest)
    return digest


def digest_of(path: Path) -> str:
    """The recorded digest of a verified entry (entry_ok(path) must hold)."""
    d = stored_digest(path)
    if d is None:
        raise PockError(f"build cache entry {str(path)!r} lost its digest while in use; build again")
    return d
