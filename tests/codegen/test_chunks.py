"""A long step (or inference pass) is emitted as functions of at most EmitOptions.chunk_nodes
nodes (g++ compiles those much faster than one huge function): the chunked library
computes exactly what the one-function library does, its profiler still sees every node
once, and the non-finite guard still stops the step from a chunk."""
import numpy as np
import pytest
import torch

import pockengine as pe
from pockengine import codegen
from pockengine.compiler import program
from pockengine.build import host

from models import GPT, batches


def _build(monkeypatch, chunk_nodes):
    torch.manual_seed(0)
    inputs, targets = batches("gpt")[0]
    prog = pe.compile(GPT(), inputs, targets, optimizer=pe.AdamW(lr=1e-3))
    source = prog.emit(options=codegen.EmitOptions(chunk_nodes=chunk_nodes))
    return prog, source.text, program.build(prog, source)


@pytest.fixture(scope="module")
def mp():
    m = pytest.MonkeyPatch()
    yield m
    m.undo()


@pytest.fixture(scope="module")
def one(mp):
    prog, source, trainer = _build(mp, 10 ** 9)
    yield prog, source, trainer
    trainer.close()


@pytest.fixture(scope="module")
def chunked(mp, one):  # after `one`: the patch below is the last one set
    prog, source, trainer = _build(mp, 16)
    yield prog, source, trainer
    trainer.close()


def test_source_is_split_into_functions(one, chunked):
    prog, source, _ = chunked
    assert "train_step_0(" not in one[1] and "inference_0(" not in one[1]
    n_step, n_fwd = len(prog.order), len(prog.forward_order)
    assert n_step > 32 and n_fwd > 16
    k_step, k_fwd = -(-n_step // 16), -(-n_fwd // 16)
    for k in range(k_step):
        assert f"pock_status train_step_{k}(PockCtx* ctx, PockProfile* const prof, int64_t& prof_t)" in source
    assert f"train_step_{k_step}(" not in source
    for k in range(k_fwd):
        assert f"pock_status inference_{k}(PockCtx* ctx)" in source
    assert f"inference_{k_fwd}(" not in source
    # each function declares only the buffers it uses: fewer than the one function's
    assert source.count("* const ") < 2 * one[1].count("* const ") + 8 * (k_step + k_fwd)


def test_chunked_step_is_bit_identical(one, chunked):
    a, b = one[2], chunked[2]
    for x, y in batches("gpt"):
        assert a.step(x, y) == b.step(x, y)
    x, _ = batches("gpt")[0]
    np.testing.assert_array_equal(a.forward(x), b.forward(x))
    sa, sb = a.state_dict(), b.state_dict()
    for name in sa:
        np.testing.assert_array_equal(sa[name], sb[name])


def test_profile_sees_every_node_once(chunked):
    prog, _, trainer = chunked
    prof = trainer.profile(*batches("gpt")[0], steps=2, warmup=0)
    assert [r["index"] for r in prof] == list(range(len(prog.order)))
    assert all(r["steps"] == 2 for r in prof)


def test_guard_stops_the_step_from_a_chunk(chunked):
    _, _, trainer = chunked
    x, y = batches("gpt")[0]
    name = next(n for n in trainer.state_dict() if n.endswith("weight"))
    w = trainer.state_dict()[name].copy()
    w.flat[0] = np.nan
    trainer.set_tensor(name, w)
    before = {n: v.copy() for n, v in trainer.state_dict().items()}
    loss = trainer.step(x, y)
    assert not np.isfinite(loss) and trainer.last_step_status == "skipped"
    for n, v in trainer.state_dict().items():
        np.testing.assert_array_equal(v, before[n])


def test_model_tu_is_built_at_model_opt(tmp_path, monkeypatch):
    seen = []
    real = host._run
    monkeypatch.setattr(host, "_run", lambda cmd, what: (seen.append(list(cmd)), real(cmd, what))[1])
    monkeypatch.setenv("POCK_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "m.cpp"
    src.write_text('#include "pock_model.h"\nint pock_chunk_probe() { return 1; }\n')
    try:
        host.build_shared_library([src], tmp_path / "out", kernels=False)
    except pe.PockError:
        pass  # no pock_compiled_model: the link may fail; the compile commands are what is checked
    model_cmd = next(c for c in seen if str(src) in c)
    assert host.MODEL_OPT in model_cmd and "-O3" not in model_cmd
    assert all("-O3" in c for c in seen if "-c" in c and str(src) not in c)
