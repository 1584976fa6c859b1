"""The model bundle: what a device SDK needs besides the compiled library.

A bundle is a directory (shipped as app assets on Android, a resource folder
on iOS) holding

    model.json         this manifest
    weights.pockckpt   the initial state (pock_save format)
    prefix/            optional: the frozen prefix for an inference runtime
                       (written by the prefix exporters, described by
                       manifest["prefix"])

The manifest names the library (`pock_<name>`), the structural hash the
checkpoint must match, and every input, target and forward output with its
shape and dtype, so the Kotlin and Swift layers can check arguments and
allocate outputs before calling the C API.  Both SDKs read this one format.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from .errors import PockError

BUNDLE_FORMAT = 1
MANIFEST = "model.json"
WEIGHTS = "weights.pockckpt"


def _io(values) -> list[dict]:
    return [{"name": v.name, "shape": list(v.shape), "dtype": v.dtype} for v in values]


def manifest(prog, prefix: dict | None = None, source=None) -> dict:
    """The manifest of a compiled program whose library is built from `source` (a
    codegen.Source; default: its all-CPU step)."""
    source = source if source is not None else prog.emit()
    opt = prog.optimizer
    return {
        "format": BUNDLE_FORMAT,
        "name": prog.name,
        "hash": source.hash,
        "library": f"pock_{prog.name}",
        "weights": WEIGHTS,
        "inputs": _io(prog.graph.inputs),
        "targets": _io(prog.graph.targets),
        "outputs": _io(prog.forward_graph.outputs),
        "optimizer": {"kind": type(opt).__name__, **{k: (list(v) if isinstance(v, tuple) else v)
                                                      for k, v in vars(opt).items()}},
        "prefix": prefix,
    }


def write_bundle(prog, weights: Path, out_dir: Path, prefix: dict | None = None, source=None) -> Path:
    """Write out_dir/model.json and copy the checkpoint `weights` beside it."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    data = Path(weights).read_bytes()
    _atomic_write(out_dir / WEIGHTS, data)
    _atomic_write(out_dir / MANIFEST, (json.dumps(manifest(prog, prefix, source), indent=2) + "\n").encode())
    return out_dir


def read_bundle(bundle_dir) -> dict:
    """The manifest of a bundle directory, checked; PockError names what is wrong."""
    path = Path(bundle_dir) / MANIFEST
    if not path.is_file():
        raise PockError(f"{bundle_dir}: not a PockEngine model bundle (no {MANIFEST})")
    try:
        m = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PockError(f"{path}: corrupt manifest: {e}") from None
    if m.get("format") != BUNDLE_FORMAT:
        raise PockError(f"{path}: bundle format {m.get('format')!r}, this PockEngine reads {BUNDLE_FORMAT}")
    for key in ("name", "hash", "library", "weights", "inputs", "targets", "outputs"):
        if key not in m:
            raise PockError(f"{path}: manifest has no {key!r}")
    return m


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
