"""The reference backend (backends/reference.py: the IR interpreted by PyTorch, gradients by
autograd) and every registered backend checked against it.

1. The interpreter itself is judged against eager PyTorch like the CPU backend is
   (tests/numerics.py: as close to an fp64 run as PyTorch fp32 is).
2. Backend vs reference, for each registered backend: the same compiled program trained 3
   steps by the backend and by the interpreter in fp64 (with the interpreter in fp32 as the
   yardstick: the backend's error against fp64 at most 4x fp32's, plus a floor); frozen
   elements bit-identical.  The HTP runs its prefix in fp16, so it is held to fp16's
   tolerance on losses and outputs (as tests/backends/test_htp.py does).
A backend registered later is picked up here by name; give it a case in CASES if it needs
a particular model (a prefix backend needs a frozen prefix)."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import pockengine as pe
from models import MODELS, SPARSE, batches
from numerics import assert_fp64_close, assert_losses_close, assert_outputs_close, assert_state_close_fp64, \
    fp64_reference
from pockengine.backends import get, names
from pockengine.backends.reference import ReferenceTrainer, build_reference
from pockengine.compiler.program import resolve_update

OPTIMIZERS = {"sgd": lambda: pe.SGD(lr=0.05, momentum=0.9, weight_decay=1e-3),
              "adamw": lambda: pe.AdamW(lr=1e-3, weight_decay=0.01)}


def _compile(name, scheme, opt):
    torch.manual_seed(0)
    model = MODELS[name]().train()
    data = batches(name)
    update = "full" if scheme == "full" else SPARSE[name]
    prog = pe.compile(model, *data[0], update=update, optimizer=OPTIMIZERS[opt]())
    return model, prog, data, update


@pytest.mark.parametrize("name,scheme,opt", [("mlp", "full", "adamw"), ("mlp", "sparse", "sgd"),
                                             ("cnn", "full", "sgd"), ("cnn", "sparse", "adamw"),
                                             ("gpt", "full", "sgd"), ("gpt", "sparse", "adamw")])
def test_reference_matches_pytorch(name, scheme, opt):
    model, prog, data, update = _compile(name, scheme, opt)
    original = {k: v.detach().clone() for k, v in model.state_dict().items()}
    ref = fp64_reference(model, data, "cross_entropy", update, OPTIMIZERS[opt](), len(data))
    trainer = prog.build(backends=["reference", "cpu"])
    assert isinstance(trainer, ReferenceTrainer)
    losses = [trainer.step(*d) for d in data]
    assert_losses_close(losses, ref)
    assert_state_close_fp64(trainer.state_dict(), ref, original, resolve_update({n: tuple(p.shape) for n, p in model.named_parameters()}, update))
    ref.model32.eval(), ref.model64.eval()  # inference: BatchNorm on running statistics
    assert_outputs_close(trainer.forward(data[0][0]), ref.model32, ref.model64, data[0][0])
    assert trainer.step_count == len(data)


def test_reference_skips_a_nonfinite_step_and_names_what_it_cannot_run():
    model, prog, data, _ = _compile("mlp", "full", "sgd")
    trainer = prog.build(backends=["reference", "cpu"])
    before = trainer.state_dict()
    x = data[0][0][0].clone()
    x[0, 0] = float("nan")
    assert not np.isfinite(trainer.step((x,), data[0][1]))
    assert trainer.last_step_status == "skipped" and trainer.step_count == 0
    for k, v in trainer.state_dict().items():
        assert np.array_equal(v, before[k]), k
    lstm = pe.compile(MODELS["lstm"](), *batches("lstm")[0])
    with pytest.raises(pe.PockError, match="reference backend has no torch function for op 'lstm'"):
        lstm.build(backends=["reference", "cpu"])


# ---- every registered backend against the reference ----------------------------------------------------
def _prefix_case():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "passes"))
    from test_prefix import _case
    model, prog, data = _case("mbv2")
    return prog, data


def _unavailable(backend: str) -> str | None:
    if backend == "vulkan":
        sys.path.insert(0, str(Path(__file__).resolve().parent / "vulkan"))
        from vk_helpers import vulkan_missing
        return vulkan_missing()
    if backend == "htp":
        try:
            import onnxruntime_qnn  # noqa: F401
        except ImportError:
            return "onnxruntime-qnn not installed"
    if backend == "coreml":
        import platform
        if platform.system() != "Darwin":
            return "Core ML runs only on Apple platforms (tests/backends/test_coreml_backend.py checks the refusal here)"
    return None


OTHERS = [b for b in names() if b != "reference"]


@pytest.mark.parametrize("backend", OTHERS)
def test_backend_matches_reference(backend):
    why = _unavailable(backend)
    if why:
        pytest.skip(why)
    if get(backend).role == "prefix":
        prog, data = _prefix_case()
        fp16 = 2e-3  # the prefix runs in fp16 on the HTP (see the module docstring)
        trainer = prog.build(backends=[backend, "cpu"])
        ref = build_reference(prog)
        for d in data[:3]:
            np.testing.assert_allclose(trainer.step(*d), ref.step(*d), rtol=fp16)
        np.testing.assert_allclose(trainer.forward(data[1][0]), ref.forward(data[1][0]), rtol=5e-2, atol=5e-3)
        assert list(trainer.state_dict()) == list(ref.state_dict())
        trainer.close()
        return
    for name, scheme, opt in [("mlp", "sparse", "adamw"), ("cnn", "sparse", "sgd")]:
        model, prog, data, update = _compile(name, scheme, opt)
        trainer = prog.build(backends=[backend] if backend == "cpu" else [backend, "cpu"])
        ref32, ref64 = build_reference(prog), build_reference(prog, dtype=torch.float64)
        before = ref32.state_dict()
        for i, d in enumerate(data):
            got, l32, l64 = trainer.step(*d), ref32.step(*d), ref64.step(*d)
            assert_fp64_close([got], [l32], [l64], f"{backend} {name}: loss of step {i}")
        sd, sd32, sd64 = trainer.state_dict(), ref32.state_dict(), ref64.state_dict()
        assert list(sd) == list(sd64)
        trained = resolve_update({n: tuple(p.shape) for n, p in model.named_parameters()}, update)
        for k in sd64:
            assert_fp64_close(sd[k], sd32[k], sd64[k], f"{backend} {name}: {k}")
            if k not in trained and k in dict(model.named_parameters()):
                assert np.array_equal(sd[k], before[k]), f"{backend} {name}: frozen {k} changed"
        x = data[0][0]
        assert_fp64_close(trainer.forward(x), ref32.forward(x), ref64.forward(x), f"{backend} {name}: output")
        trainer.close()
