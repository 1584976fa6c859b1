"""The checkpoint format of native/runtime/checkpoint.cpp, in Python.

The compiler writes a model bundle's initial weights with write_checkpoint()
without loading the model library (it may be built for another machine);
read_checkpoint() inspects any checkpoint that pock_save wrote.  The byte
layout is documented at the top of checkpoint.cpp: version 2 is written (the data
region an image of the model's state, which the runtime maps), versions 1 and 2 read.
"""
from __future__ import annotations

import itertools
import math
import os
import re
import secrets
import stat
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
import numpy as np

from ..errors import PockError

MAGIC = b"POCKCKPT"
VERSION = 2  # written; version 1 is read too
DATA_ALIGN = 4096  # where the data region starts (checkpoint.cpp kDataAlign)
KINDS = {"param": 0, "buffer": 1, "optimizer_state": 2, "constant": 3}
_DTYPES = {0: np.dtype("<f4"), 1: np.dtype("<i8"), 2: np.dtype("<i4"), 3: np.dtype("u1"), 4: np.dtype("<u2"),
           5: np.dtype("<f2"), 6: np.dtype("i1")}  # 4: bf16 bits
_MAX_DIMS = 8
MAX_STEPS = 2**53  # as checkpoint.cpp: larger step counts are rejected


@dataclass
class Checkpoint:
    model_hash: str
    step: int = 0
    lr: float = 0.0
    # name -> (kind name, array), in file order
    tensors: dict[str, tuple[str, np.ndarray]] = field(default_factory=dict)
    # the data region's layout: {name: offset} and its size.  None: each tensor after the
    # previous one, 64-byte aligned.  write_initial_checkpoint gives the model's state
    # layout (so the runtime maps the file); decode keeps a version-2 file's.
    offsets: dict[str, int] | None = None
    data_bytes: int | None = None


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


def _layout(ckpt: Checkpoint, sizes: dict[str, int]) -> tuple[dict[str, int], int]:
    """(offsets, data_bytes): ckpt's own when they hold every tensor without overlap, else packed."""
    offsets, total = ckpt.offsets, ckpt.data_bytes
    if offsets is not None and total is not None and set(offsets) == set(sizes):
        spans = sorted((offsets[k], offsets[k] + sizes[k]) for k in sizes)
        if all(a >= 0 for a, _ in spans) and all(b <= total for _, b in spans) and \
                all(b0 <= a1 for (_, b0), (a1, _) in zip(spans, spans[1:])):
            return dict(offsets), total
    offsets, at = {}, 0
    for name, size in sizes.items():
        offsets[name] = at
        at += _align(max(size, 1), 64)
    return offsets, at


def encode(ckpt: Checkpoint) -> bytes:
    codes = {dt: code for code, dt in _DTYPES.items()}
    entries, blobs = [], {}
    for name, (kind, arr) in ckpt.tensors.items():
        arr = np.asarray(arr)
        dt = arr.dtype.newbyteorder("<")
        if dt not in codes or kind not in KINDS or arr.ndim > _MAX_DIMS:
            raise PockError(f"checkpoint tensor {name!r}: cannot store kind {kind!r}, "
                            f"dtype {arr.dtype.name}, {arr.ndim} dims")
        blobs[name] = np.ascontiguousarray(arr, dtype=dt).tobytes()
        entries.append((name, struct.pack(f"<iii{arr.ndim}qq", KINDS[kind], codes[dt], arr.ndim, *arr.shape,
                                          len(blobs[name]))))
    offsets, data_bytes = _layout(ckpt, {k: len(b) for k, b in blobs.items()})
    table = b"".join(_string(name) + head + struct.pack("<q", offsets[name]) for name, head in entries)
    head = b"".join([MAGIC, struct.pack("<I", VERSION), _string(ckpt.model_hash),
                     struct.pack("<qfI", ckpt.step, ckpt.lr, len(ckpt.tensors))])
    data_at = _align(len(head) + 16 + len(table), DATA_ALIGN)
    region = bytearray(data_bytes)
    for name, b in blobs.items():
        region[offsets[name]:offsets[name] + len(b)] = b
    body = b"".join([head, struct.pack("<qq", data_at, data_bytes), table,
                     bytes(data_at - len(head) - 16 - len(table)), region])
    return body + struct.pack("<I", zlib.crc32(body))


def encode_v1(ckpt: Checkpoint) -> bytes:
    """Version 1: each tensor's bytes right after its entry, no data region. A trained-only
    checkpoint (trained_ckpt.py, the runtime's trained_ckpt.cpp) holds a subset of the
    state, which is never mapped, in this form."""
    parts = [MAGIC, struct.pack("<I", 1), _string(ckpt.model_hash),
             struct.pack("<qfI", ckpt.step, ckpt.lr, len(ckpt.tensors))]
    codes = {dt: code for code, dt in _DTYPES.items()}
    for name, (kind, arr) in ckpt.tensors.items():
        arr = np.asarray(arr)
        dt = arr.dtype.newbyteorder("<")
        if dt not in codes or kind not in KINDS or arr.ndim > _MAX_DIMS:
            raise PockError(f"checkpoint tensor {name!r}: cannot store kind {kind!r}, "
                            f"dtype {arr.dtype.name}, {arr.ndim} dims")
        data = np.ascontiguousarray(arr, dtype=dt).tobytes()
        parts += [_string(name), struct.pack(f"<iii{arr.ndim}qq", KINDS[kind], codes[dt], arr.ndim, *arr.shape,
                                             len(data)), data]
    body = b"".join(parts)
    return body + struct.pack("<I", zlib.crc32(body))


def decode(blob: bytes, where: str = "checkpoint") -> Checkpoint:
    if len(blob) < 8 or blob[:8] != MAGIC:
        raise PockError(f"{where} is not a PockEngine checkpoint (bad magic)")
    if len(blob) < 16:
        raise PockError(f"{where} is truncated ({len(blob)} bytes)")
    stored, computed = struct.unpack("<I", blob[-4:])[0], zlib.crc32(blob[:-4])
    if stored != computed:
        raise PockError(f"{where} is corrupt or truncated (CRC-32 mismatch: stored {stored:08x}, "
                        f"computed {computed:08x})")
    version = struct.unpack_from("<I", blob, 8)[0]
    if version not in (1, VERSION):
        raise PockError(f"{where} has format version {version}; this reader reads versions 1 and {VERSION}")
    kinds = {v: k for k, v in KINDS.items()}
    body, pos = memoryview(blob)[:-4], 12
    try:
        (n,), pos = struct.unpack_from("<I", body, pos), pos + 4
        model_hash, pos = bytes(body[pos:pos + n]).decode(), pos + n
        (step, lr, count), pos = struct.unpack_from("<qfI", body, pos), pos + 16
        if not 0 <= step <= MAX_STEPS:
            raise ValueError(f"step count {step} is outside [0, 2^53]")
        if not (math.isfinite(lr) and lr >= 0):
            raise ValueError(f"learning rate {lr} is not finite and >= 0")
        ckpt = Checkpoint(model_hash, step, lr)
        if version == 2:
            (data_at, data_bytes), pos = struct.unpack_from("<qq", body, pos), pos + 16
            if not (pos <= data_at and data_bytes >= 0 and data_at + data_bytes == len(body)):
                raise ValueError(f"data region of {data_bytes} bytes at {data_at} does not end at the CRC")
            ckpt.offsets, ckpt.data_bytes = {}, data_bytes
        table = body[:data_at] if version == 2 else body  # the tensor table ends before the data region
        for _ in range(count):
            (n,), pos = struct.unpack_from("<I", table, pos), pos + 4
            if pos + n > len(table):
                raise ValueError("truncated tensor table")
            name, pos = bytes(table[pos:pos + n]).decode(), pos + n
            (kind, dtype, ndim), pos = struct.unpack_from("<iii", table, pos), pos + 12
            shape, pos = struct.unpack_from(f"<{ndim}q", table, pos), pos + 8 * ndim
            (nbytes,), pos = struct.unpack_from("<q", table, pos), pos + 8
            if version == 2:
                (at,), pos = struct.unpack_from("<q", table, pos), pos + 8
                if not (0 <= at and 0 <= nbytes <= data_bytes - at):
                    raise ValueError(f"tensor {name!r} lies outside the data region")
                start = data_at + at
                ckpt.offsets[name] = at
            else:
                if pos + nbytes > len(body):
                    raise ValueError("tensor data runs past the end")
                start, pos = pos, pos + nbytes
            arr = np.frombuffer(body[start:start + nbytes], dtype=_DTYPES[dtype]).reshape(shape).copy()
            ckpt.tensors[name] = (kinds[kind], arr)
    except (struct.error, KeyError, ValueError, UnicodeDecodeError) as e:
        raise PockError(f"{where} is corrupt: {e}") from None
    if version == 1 and pos != len(body):
        raise PockError(f"{where} is corrupt: {len(body) - pos} unexpected bytes after the last tensor")
    return ckpt


def read_regular(path, what: str = "checkpoint") -> bytes:
    """The bytes of the regular file at path; anything else (a FIFO, which would block
    forever, a device, a directory) is refused with PockError, as pock_load does."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise PockError(f"cannot read {what} {os.fspath(path)!r}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise PockError(f"cannot read {what} {os.fspath(path)!r}: it is {_kind(mode)}, not a regular file")
        os.set_blocking(fd, True)
        try:
            return f.read()
        except OSError as e:
            raise PockError(f"cannot read {what} {os.fspath(path)!r}: {e.strerror}") from None


def read_checkpoint(path) -> Checkpoint:
    return decode(read_regular(path), f"checkpoint {os.fspath(path)!r}")


_SAVES = itertools.count()
_TEMP_BASE_MAX = 255 - (5 + 20 + 1 + 20 + 1 + 16)  # NAME_MAX less the longest ".tmp-<pid>-<n>-<16 hex>"


def _temp_prefix(path: Path) -> str:
    """What every temporary name of path starts with: its name, cut (in bytes, as the runtime
    cuts it) so the temporary name fits NAME_MAX, then ".tmp-"."""
    return os.fsdecode(os.fsencode(path.name)[:_TEMP_BASE_MAX]) + ".tmp-"


def temp_path(path: Path) -> Path:
    """"<path>.tmp-<pid>-<counter>-<random>", as the runtime names it: unique per save."""
    return path.with_name(f"{_temp_prefix(path)}{os.getpid()}-{next(_SAVES)}-{secrets.token_hex(8)}")


def _kind(mode: int) -> str:
    for test, what in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "not a regular file"


def save_target(path, what: str = "cannot save checkpoint") -> Path:
    """The file a save to path replaces: path, or the final target of the symbolic links it
    names (a save goes through a link and keeps it).  Anything there but a regular file (or
    nothing yet) is refused with PockError ("<what> '<path>': ..."): a device, a FIFO, a
    directory is never replaced."""
    target = Path(os.path.realpath(path))
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        return target
    except OSError as e:
        raise PockError(f"{what} {os.fspath(path)!r}: {e.strerror}") from None
    if not stat.S_ISREG(mode):
        raise PockError(f"{what} {os.fspath(path)!r}: {str(target)!r} is {_kind(mode)}, not a regular "
                        f"file; nothing was written")
    return target


def _remove(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass  # e.g. its folder is a file: nothing was written


def write_atomically(path, blob, what: str = "cannot save checkpoint") -> None:
    """Write blob to path the way pock_save does: through symbolic links, refusing anything but
    a regular file, via a temporary file (fsynced, renamed over the target, directory fsynced).
    blob is the bytes, or a function that writes the file at the temporary Path it is given
    (a writer that opens the file itself, e.g. gguf.GGUFWriter).  On failure nothing at path
    changes and the PockError starts "<what> '<path>'"."""
    target = save_target(path, what)
    remove_orphans(target)
    tmp = temp_path(target)
    try:
        if callable(blob):
            blob(tmp)
        else:
            with open(tmp, "wb") as f:
                f.write(blob)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except OSError as e:
        _remove(tmp)
        raise PockError(f"{what} {os.fspath(path)!r}: {e.strerror or e}") from None
    except BaseException:
        _remove(tmp)
        raise
    try:
        fd = os.open(target.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)  # make the rename durable; best effort
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_orphans(path: Path) -> None:
    """Remove "<path>.tmp-<pid>[-...]" files whose process is gone (a crash during a save)."""
    pattern = re.compile(re.escape(_temp_prefix(path)) + r"(\d+)(?:-.*)?$")
    try:
        names = os.listdir(path.parent)
    except OSError:
        return
    for name in names:
        m = pattern.match(name)
        if not m:
            continue
        try:
            os.kill(int(m.group(1)), 0)
            continue  # alive: maybe saving right now
        except ProcessLookupError:
            pass
        except (OSError, OverflowError):
            continue
        try:
            os.unlink(path.parent / name)
        except OSError:
            pass


def write_checkpoint(path, ckpt: Checkpoint) -> None:
    """Atomically (temporary file, fsync, rename) write ckpt to path (write_atomically)."""
    write_atomically(path, encode(ckpt))


def _string(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<I", len(b)) + b


# IR state kinds and dtypes (ir/graph.py) -> checkpoint kind names and numpy dtypes
_IR_KINDS = {"param": "param", "buffer": "buffer", "opt_state": "optimizer_state", "const": "constant"}
_IR_DTYPES = {"f32": np.float32, "i64": np.int64, "i32": np.int32, "u8": np.uint8, "bf16": np.uint16,
              "f16": np.float16, "i8": np.int8, "q4": np.uint8}


def write_initial_checkpoint(prog, path, source=None) -> Path:
    """A compiled program's initial state in pock_save's format, without building it for
    this host: what building `source` (default: the all-CPU step) + trainer.save(path)
    writes (the state's data, zeros where it has none, step 0, the optimizer's learning rate)."""
    source = source if source is not None else prog.emit()
    tensors = {}
    offsets = prog.state_offsets
    for name, v in sorted(prog.state.items(), key=lambda kv: offsets[kv[0]]):  # kState's order
        dtype = _IR_DTYPES[v.dtype]
        data = np.zeros(v.shape, dtype) if v.data is None else np.asarray(v.data, dtype)
        tensors[name] = (_IR_KINDS[v.kind], data.reshape(v.shape))
    # the data region is the state image (codegen.render's state_bytes), which pock_open maps
    write_checkpoint(path, Checkpoint(source.hash, 0, float(prog.optimizer.lr), tensors,
                                      dict(offsets), max(prog.state_bytes, 64)))
    return Path(path)
