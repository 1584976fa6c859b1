"""Golden tests of the generated C++: a tiny MLP (SGD with momentum, a partial update) and
a tiny GPT (AdamW, one block trained) against the files in tests/codegen/golden/, so a
change to the code generator shows up as a diff a reviewer can read.

Regenerate after an intended change with

    POCK_REGEN_GOLDEN=1 pytest tests/codegen/test_golden.py

and review `git diff tests/codegen/golden/`."""
import difflib
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import pockengine as pe

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models import GPT  # noqa: E402

GOLDEN = Path(__file__).resolve().parent / "golden"


def tiny_mlp():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    x, y = torch.randn(2, 4), torch.randint(0, 3, (2,))
    return pe.compile(model, (x,), (y,), loss="cross_entropy", update={"0.weight": 0.5, "2.*": 1.0},
                      optimizer=pe.SGD(lr=0.1, momentum=0.9), name="tiny_mlp")


def tiny_gpt():
    torch.manual_seed(0)
    model = GPT(vocab=16, d=8, layers=1, heads=2, seq=4)
    x, y = torch.randint(0, 16, (1, 4)), torch.randint(0, 16, (1, 4))
    return pe.compile(model, (x,), (y,), loss="cross_entropy", update={"blocks.0.fc*": 1.0, "ln_f.*": 1.0},
                      optimizer=pe.AdamW(lr=1e-3), name="tiny_gpt", exact_skip=False)  # tiny_mlp: exact


@pytest.mark.parametrize("make", [tiny_mlp, tiny_gpt], ids=["tiny_mlp", "tiny_gpt"])
def test_generated_source_matches_golden(make):
    prog = make()
    got = prog.source()
    path = GOLDEN / f"{prog.name}.cpp"
    if os.environ.get("POCK_REGEN_GOLDEN"):
        path.write_text(got)
    want = path.read_text()
    if got != want:
        diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True),
                                            f"golden/{path.name}", "generated", n=2))
        pytest.fail(f"generated C++ differs from {path} (POCK_REGEN_GOLDEN=1 to accept):\n{diff[:6000]}")


def test_buffers_are_named_after_the_module_path():
    src = (GOLDEN / "tiny_gpt.cpp").read_text()
    for name in ("blocks_0_fc1_out", "d_blocks_0_fc1_weight", "blocks_0_fc1_weight", "ln_f_out", "input0"):
        assert f"* const {name} = " in src, name
    assert "POCK_PROFILE_NODE(0);" in src
