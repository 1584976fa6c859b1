"""The runtime, the kernels and one compiled model under AddressSanitizer and
UBSan (issue 13): a token model whose step runs the embedding, LayerNorm,
linear, GELU, LSTM, cross-entropy and AdamW kernels plus the index and
non-finite guards, driven through pock.h by a C program
(tests/native/runtime/sanitize/e2e_driver.c): good steps, ids of +-10^6, a NaN
input, forward, save and load.  Any sanitizer report fails the test."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import pockengine as pe
from pockengine.build.host import build_shared_library
from pockengine.runtime.checkpoint import write_initial_checkpoint

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "tests" / "native" / "runtime" / "sanitize" / "e2e_driver.c"
SANITIZE = ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"]


class TokenLM(nn.Module):
    def __init__(self, vocab=40, d=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.proj = nn.Linear(4, d)
        self.norm = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 2 * d)
        self.lstm = nn.LSTM(2 * d, d, batch_first=True)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids, feats):
        h = self.fc(self.norm(self.emb(ids) + self.proj(feats)))
        out, _ = self.lstm(torch.nn.functional.gelu(h))
        return self.head(out)


def test_compiled_step_under_asan_and_ubsan(tmp_path):
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    torch.manual_seed(0)
    ids, feats = torch.randint(0, 40, (2, 5)), torch.randn(2, 5, 4)
    targets = torch.randint(0, 40, (2, 5))
    prog = pe.compile(TokenLM(), (ids, feats), (targets,), optimizer=pe.AdamW(lr=1e-2), name="asan_token_lm")
    src = tmp_path / "asan_token_lm.cpp"
    src.write_text(prog.source())
    ckpt = write_initial_checkpoint(prog, tmp_path / "init.pock")
    lib = build_shared_library([src], tmp_path / "lib", SANITIZE)
    exe = tmp_path / "e2e_driver"
    subprocess.run([cc, "-std=c99", "-Wall", "-Werror", *SANITIZE, "-I", str(ROOT / "native/runtime/include"),
                    str(DRIVER), str(lib), f"-Wl,-rpath,{lib.parent}", "-lm", "-o", str(exe)], check=True)
    (tmp_path / "work").mkdir()
    env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:halt_on_error=1",
           "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}
    r = subprocess.run([str(exe), str(ckpt), str(tmp_path / "work")], capture_output=True, text=True, timeout=300,
                       env=env)
    assert r.returncode == 0 and "ALL OK" in r.stdout, r.stdout + r.stderr[-4000:]
    assert "runtime error" not in r.stderr and "AddressSanitizer" not in r.stderr, r.stderr[-4000:]
