"""Checkpoints that fit a phone: only what training changes.

`trainer.save(path, trained_only=True)` writes the trained parameters (LoRA
adapters, the tensors the update dict names), the buffers (e.g. running
statistics, which training mutates), every optimizer-state tensor, the step
count and the learning rate, tied to the frozen base weights by a SHA-256 of
those weights (names, shapes and bytes). The frozen weights themselves are not
written: they ship with the app.

Format: MAGIC, u32 version, u32 length + base hash (hex), then one ordinary
checkpoint (checkpoint.encode: its own model hash and CRC-32) holding the
subset. `load` checks the magic, the CRC, the model hash and the base hash
before anything changes, then restores through pock_load of a full checkpoint
assembled in memory (current state with the subset replaced), so a failure
leaves the trainer as it was.
"""
from __future__ import annotations

import hashlib
import os
import stat
import struct
import tempfile
from pathlib import Path

import numpy as np

from .checkpoint import decode, encode, encode_v1, read_regular, write_atomically
from ..errors import PockError

MAGIC = b"POCKTRND"
VERSION = 1


def is_trained_only(path) -> bool:
    try:  # O_NONBLOCK: a FIFO must not block here (pock_load refuses it)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:  # not a regular file (a directory, FIFO, device): pock_load names the problem
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        return os.pread(fd, 8, 0) == MAGIC
    except OSError:
        return False
    finally:
        os.close(fd)


def _frozen_names(trainer) -> list[str]:
    trained = set(trainer.trained_names or ())
    return [t.name for t in trainer.tensors if t.kind == "param" and t.name not in trained]


def base_hash(trainer) -> str:
    """SHA-256 over the frozen parameters' names, shapes and bytes (model order)."""
    h = hashlib.sha256()
    for name in _frozen_names(trainer):
        arr = np.ascontiguousarray(trainer.get_tensor(name))
        h.update(name.encode() + b"\0" + str(arr.shape).encode() + str(arr.dtype).encode())
        h.update(arr.tobytes())
    return h.hexdigest()


def _full_checkpoint(trainer):
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d) / "full.pockckpt"
        trainer._check(trainer._lib.pock_save(trainer._live(), os.fsencode(str(tmp))))
        return decode(tmp.read_bytes(), str(tmp))


def save_trained_only(trainer, path) -> None:
    if trainer.trained_names is None:
        raise PockError("save(trained_only=True) needs to know what is trained: use the trainer "
                        "from prog.build()")
    full = _full_checkpoint(trainer)
    frozen = set(_frozen_names(trainer))
    full.tensors = {n: kv for n, kv in full.tensors.items() if kv[0] != "constant" and n not in frozen}
    digest = base_hash(trainer).encode()
    blob = MAGIC + struct.pack("<II", VERSION, len(digest)) + digest + encode_v1(full)
    write_atomically(path, blob)


def load_trained_only(trainer, path) -> None:
    path = Path(path)
    blob = read_regular(path, "trained-only checkpoint")
    where = f"trained-only checkpoint {str(path)!r}"
    if len(blob) < 16 or blob[:8] != MAGIC:
        raise PockError(f"{where} is not a trained-only checkpoint (bad magic)")
    version, n = struct.unpack_from("<II", blob, 8)
    if version != VERSION:
        raise PockError(f"{where} has format version {version}; this reader reads version {VERSION}")
    stored = blob[16:16 + n].decode(errors="replace")
    sub = decode(blob[16 + n:], where)
    if sub.model_hash != trainer.model_hash:
        raise PockError(f"{where} is for another model (hash {sub.model_hash[:12]}, this model "
                        f"{trainer.model_hash[:12]})")
    if stored != base_hash(trainer):
        raise PockError(f"{where} was trained on other base weights (base hash {stored[:12]} != "
                        f"{base_hash(trainer)[:12]}): load the base weights it was trained from first")
    full = _full_checkpoint(trainer)
    for name, (kind, arr) in sub.tensors.items():
        if name not in full.tensors or full.tensors[name][1].shape != arr.shape:
            raise PockError(f"{where}: tensor {name!r} does not fit this model")
        full.tensors[name] = (kind, arr)
    full.step, full.lr = sub.step, sub.lr
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d) / "merged.pockckpt"
        tmp.write_bytes(encode(full))
        trainer._check(trainer._lib.pock_load(trainer._live(), os.fsencode(str(tmp))))
