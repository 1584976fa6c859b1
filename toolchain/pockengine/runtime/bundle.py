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

from ..errors import PockError

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


# The manifest's bounds, the same in ModelBundle.kt and ModelManifest.swift.
MAX_MANIFEST_BYTES = 4 << 20
MAX_DEPTH = 64
MAX_DIMS = 8
MAX_TENSORS = 4096
MAX_TENSOR_BYTES = 2**31 - 1 - 8  # what one Java array holds
DTYPE_BYTES = {"f32": 4, "i64": 8, "i32": 4, "u8": 1, "bf16": 2, "f16": 2, "i8": 1}


def read_bundle(bundle_dir) -> dict:
    """The manifest of a bundle directory, checked (check_manifest); PockError names what is wrong."""
    path = Path(bundle_dir) / MANIFEST
    if not path.is_file():
        raise PockError(f"{bundle_dir}: not a PockEngine model bundle (no {MANIFEST})")
    if path.stat().st_size > MAX_MANIFEST_BYTES:
        raise PockError(f"{path}: {path.stat().st_size} bytes, more than a manifest may hold ({MAX_MANIFEST_BYTES})")
    text = path.read_bytes()
    _check_nesting(text, str(path))
    try:
        m = json.loads(text, parse_constant=_no_constant)
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as e:
        raise PockError(f"{path}: corrupt manifest: {e}") from None
    if not isinstance(m, dict):
        raise PockError(f"{path}: the manifest is not a JSON object")
    if m.get("format") != BUNDLE_FORMAT or type(m.get("format")) is not int:
        raise PockError(f"{path}: bundle format {m.get('format')!r}, this PockEngine reads {BUNDLE_FORMAT}")
    check_manifest(m, bundle_dir, str(path))
    return m


def _no_constant(name):
    raise ValueError(f"{name} is not JSON")


def _check_nesting(text: bytes, where: str) -> None:
    depth, in_string, escaped = 0, False, False
    for c in text:
        if in_string:
            if escaped:
                escaped = False
            elif c == 0x5C:
                escaped = True
            elif c == 0x22:
                in_string = False
        elif c == 0x22:
            in_string = True
        elif c in (0x5B, 0x7B):
            depth += 1
            if depth > MAX_DEPTH:
                raise PockError(f"{where}: corrupt manifest: JSON nesting deeper than {MAX_DEPTH}")
        elif c in (0x5D, 0x7D):
            depth -= 1


def _type(v) -> str:
    return {type(None): "null", str: "a string", int: "a number", float: "a number", bool: "a boolean",
            list: "a list", dict: "an object"}.get(type(v), type(v).__name__)


def check_manifest(m: dict, bundle_dir, where: str) -> None:
    """The manifest schema with its bounds; PockError names the field."""
    def bad(field, why):
        raise PockError(f"{where}: manifest field {field!r} {why}")

    for key in ("name", "hash", "library", "weights"):
        if type(m.get(key)) is not str or not m[key] or "\0" in m[key]:
            bad(key, f"must be a non-empty string, got {_type(m.get(key))}")
    _inside(bundle_dir, m["weights"], "weights", bad)
    for key in ("inputs", "targets", "outputs"):
        tensors = m.get(key)
        if type(tensors) is not list:
            bad(key, f"must be a list, got {_type(tensors)}")
        if len(tensors) > MAX_TENSORS:
            bad(key, f"lists {len(tensors)} tensors, more than {MAX_TENSORS}")
        for i, t in enumerate(tensors):
            _check_tensor(t, f"{key}[{i}]", bad)
    prefix = m.get("prefix")
    if prefix is not None:
        if type(prefix) is not dict:
            bad("prefix", f"must be an object or null, got {_type(prefix)}")
        files = prefix.get("files") or {}
        if type(files) is not dict:
            bad("prefix.files", f"must be an object, got {_type(files)}")
        for k, v in files.items():
            if type(v) is not str:
                bad(f"prefix.files.{k}", f"must be a string, got {_type(v)}")
            _inside(bundle_dir, v, f"prefix.files.{k}", bad)


def _check_tensor(t, field: str, bad) -> None:
    if type(t) is not dict:
        bad(field, f"must be an object, got {_type(t)}")
    if type(t.get("name")) is not str:
        bad(f"{field}.name", f"must be a string, got {_type(t.get('name'))}")
    if type(t.get("dtype")) is not str or t["dtype"] not in DTYPE_BYTES:
        bad(f"{field}.dtype", f"is {t.get('dtype')!r}, which no SDK knows")
    shape = t.get("shape")
    if type(shape) is not list:
        bad(f"{field}.shape", f"must be a list, got {_type(shape)}")
    if len(shape) > MAX_DIMS:
        bad(f"{field}.shape", f"has {len(shape)} dims, more than {MAX_DIMS}")
    nbytes = DTYPE_BYTES[t["dtype"]]
    for d, n in enumerate(shape):
        if type(n) is not int:
            bad(f"{field}.shape[{d}]", f"must be an integer, got {_type(n)}")
        if n < 0:
            bad(f"{field}.shape[{d}]", f"is {n}; a dimension must be >= 0")
        if n > 2**31 - 1:
            bad(f"{field}.shape[{d}]", f"is {n}, more than {2**31 - 1}")
        nbytes *= n
    if nbytes > MAX_TENSOR_BYTES:
        bad(f"{field}.shape", f"{shape} of {t['dtype']} needs more than {MAX_TENSOR_BYTES} bytes")


def _inside(bundle_dir, rel: str, field: str, bad) -> None:
    """rel must be relative, without '..', and resolve (symlinks too) inside bundle_dir."""
    if rel.startswith(("/", "\\")) or "\\" in rel or os.path.isabs(rel) or ".." in rel.split("/"):
        bad(field, f"({rel!r}) must name a file inside the bundle (a relative path without '..')")
    root = os.path.realpath(bundle_dir)
    real = os.path.realpath(os.path.join(bundle_dir, rel))
    if not real.startswith(root + os.sep):
        bad(field, f"({rel!r}) resolves to {real}, outside the bundle {root}")


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
