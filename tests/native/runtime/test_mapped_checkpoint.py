"""Frozen weights mapped from the checkpoint, not copied (native/runtime/checkpoint.cpp):
a plain C process (bench/footprint.c linked against the compiled library) opens a checkpoint
and trains; /proc/self/smaps shows the frozen weights as clean file-backed pages, they stay
bit-identical, and the private dirty memory is smaller than with a version-1 file (copied)."""
import importlib.util
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

import pockengine as pe
from pockengine.runtime.checkpoint import MAGIC, KINDS, read_checkpoint, write_initial_checkpoint
from pockengine.memory.plan import is_mapped
from pockengine.compiler.program import written_state

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("pock_bench_footprint", ROOT / "bench" / "footprint.py")
footprint = importlib.util.module_from_spec(spec)
spec.loader.exec_module(footprint)


def encode_v1(ckpt) -> bytes:
    """A version-1 file (tensors inline, nothing padded): what older runtimes wrote."""
    codes = {np.dtype("<f4"): 0, np.dtype("<i8"): 1, np.dtype("u1"): 3, np.dtype("<u2"): 4, np.dtype("<f2"): 5,
             np.dtype("i1"): 6, np.dtype("<i4"): 2}
    h = ckpt.model_hash.encode()
    parts = [MAGIC, struct.pack("<II", 1, len(h)), h, struct.pack("<qfI", ckpt.step, ckpt.lr, len(ckpt.tensors))]
    for name, (kind, arr) in ckpt.tensors.items():
        data = np.ascontiguousarray(arr).tobytes()
        parts += [struct.pack("<I", len(name)), name.encode(),
                  struct.pack(f"<iii{arr.ndim}qq", KINDS[kind], codes[arr.dtype], arr.ndim, *arr.shape, len(data)),
                  data]
    body = b"".join(parts)
    return body + struct.pack("<I", zlib.crc32(body))


@pytest.fixture(scope="module", params=["fp32", "q4"])
def built(request, tmp_path_factory):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    x, y = torch.randn(8, 256), torch.randint(0, 10, (8,))
    prog = pe.compile(model, (x,), (y,), update={"4.*": 1.0}, optimizer=pe.AdamW(lr=1e-2),
                      frozen_dtype=request.param, name=f"mapped_{request.param}")
    d = tmp_path_factory.mktemp(f"mapped_{request.param}")
    trainer = prog.build(out_dir=d)
    driver = footprint.build_driver(trainer.lib_path, d / "footprint")
    ckpt = write_initial_checkpoint(prog, d / "init.pockckpt")
    return prog, driver, ckpt, d


def test_frozen_weights_are_clean_mapped_pages_and_stay_bit_identical(built):
    prog, driver, ckpt, d = built
    written = written_state(prog.graph, prog.trained)
    frozen = [v for v in prog.state.values() if is_mapped(v, written)]
    frozen_kb = sum(v.nbytes for v in frozen) / 1024
    private_kb = sum(v.nbytes for v in prog.state.values() if not is_mapped(v, written)) / 1024
    r = footprint.measure(driver, ckpt, steps=3, id_range=10, save=d / "after.pockckpt")
    # every frozen weight was read by the steps: resident, clean, backed by the file
    assert r["train_ckpt_clean_kb"] >= 0.9 * frozen_kb, r
    # only the trained head and its optimizer state were copied (a page or two of slack each)
    assert r["train_ckpt_dirty_kb"] <= private_kb + 16, r
    before, after = read_checkpoint(ckpt), read_checkpoint(d / "after.pockckpt")
    assert after.step == 3
    for v in frozen:
        assert np.array_equal(before.tensors[v.name][1], after.tensors[v.name][1]), v.name
    assert not np.array_equal(before.tensors["4.weight"][1], after.tensors["4.weight"][1])


def test_version_1_is_copied_with_the_same_results_and_more_private_memory(built):
    prog, driver, ckpt, d = built
    v1 = d / "v1.pockckpt"
    v1.write_bytes(encode_v1(read_checkpoint(ckpt)))
    mapped = footprint.measure(driver, ckpt, steps=3, id_range=10, save=d / "m.pockckpt")
    copied = footprint.measure(driver, v1, steps=3, id_range=10, save=d / "c.pockckpt")
    a, b = read_checkpoint(d / "m.pockckpt"), read_checkpoint(d / "c.pockckpt")
    for name, (_, arr) in a.tensors.items():
        assert np.array_equal(arr, b.tensors[name][1]), name  # same steps, same bits
    frozen_kb = sum(v.nbytes for v in prog.state.values() if is_mapped(v, written_state(prog.graph, prog.trained)))
    frozen_kb /= 1024
    assert copied["train_ckpt_dirty_kb"] == 0 and copied["train_ckpt_rss_kb"] == 0  # nothing of it stays mapped
    assert mapped["train_private_dirty_kb"] <= copied["train_private_dirty_kb"] - 0.8 * frozen_kb, (mapped, copied)
