"""Judging a trained state the way numerical libraries do.

An elementwise rtol against a PyTorch fp32 run is fragile: a near-cancelling
gradient sum rounds differently under another SIMD width or summation order,
and AdamW turns that rounding difference into about +-lr on one element. So
end-to-end results are judged against the same steps run by PyTorch in
**fp64**: per tensor (and per loss), our largest error against fp64 must be
at most FACTOR times PyTorch fp32's own largest error against fp64, plus a
tiny floor relative to the tensor's magnitude. Frozen elements are still
required to be bit-identical to the original weights.

    ref = fp64_reference(model, batches, loss, update, optimizer, steps)
    assert_losses_close(losses, ref)
    assert_state_close_fp64(trainer.state_dict(), ref, original, trained)
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch

from helpers import reference_train
from pockengine.ops import FULL

FACTOR = 4.0        # our error may be this many times PyTorch fp32's
REL_FLOOR = 1e-6    # plus this fraction of the tensor's largest fp64 magnitude (~8 fp32 ulps)
ABS_FLOOR = 1e-7    # plus this, for tensors that are (nearly) all zero


@dataclass
class Fp64Reference:
    losses32: list
    losses64: list
    model32: torch.nn.Module
    model64: torch.nn.Module


def to64(x):
    """A float tensor in fp64 (anything else unchanged); nested tuples/lists too."""
    if isinstance(x, (tuple, list)):
        return type(x)(to64(t) for t in x)
    return x.double() if torch.is_tensor(x) and x.is_floating_point() else x


def fp64_reference(model, batches, loss, update, optimizer, steps):
    """The same steps run by PyTorch in fp32 and in fp64 (helpers.reference_train)."""
    losses32, model32 = reference_train(model, batches, loss, update, optimizer, steps)
    batches64 = [(to64(tuple(i)), to64(tuple(t))) for i, t in batches]
    losses64, model64 = reference_train(copy.deepcopy(model).double(), batches64, loss, update, optimizer, steps)
    return Fp64Reference(losses32, losses64, model32, model64)


def error_budget(ref32, ref64, factor=FACTOR, rel_floor=REL_FLOOR):
    ref32 = np.asarray(ref32, np.float64)
    ref64 = np.asarray(ref64, np.float64)
    err32 = float(np.max(np.abs(ref32 - ref64))) if ref64.size else 0.0
    scale = float(np.max(np.abs(ref64))) if ref64.size else 0.0
    return factor * err32 + rel_floor * scale + ABS_FLOOR, err32


def assert_fp64_close(got, ref32, ref64, what="tensor", factor=FACTOR, rel_floor=REL_FLOOR):
    """max|got - fp64| <= factor * max|fp32 - fp64| + floor."""
    got = np.asarray(got, np.float64)
    ref64 = np.asarray(ref64, np.float64)
    assert got.shape == ref64.shape, f"{what}: shape {got.shape} != {ref64.shape}"
    budget, err32 = error_budget(ref32, ref64, factor, rel_floor)
    err = float(np.max(np.abs(got - ref64))) if got.size else 0.0
    assert err <= budget, (f"{what}: error against PyTorch fp64 {err:.3g} exceeds {factor}x PyTorch fp32's "
                           f"({err32:.3g}) + floor = {budget:.3g}")


def assert_losses_close(losses, ref: Fp64Reference, factor=FACTOR, rel_floor=REL_FLOOR):
    assert len(losses) == len(ref.losses64)
    for i, (got, l32, l64) in enumerate(zip(losses, ref.losses32, ref.losses64)):
        assert_fp64_close([got], [l32], [l64], f"loss of step {i}", factor, rel_floor)


def _numpy(t):
    return t.detach().cpu().numpy()


def assert_state_close_fp64(state_dict, ref: Fp64Reference, original, trained,
                            factor=FACTOR, rel_floor=REL_FLOOR, names=None):
    """Every parameter/buffer of state_dict judged against the fp64 run; frozen
    parameters and frozen slices bit-identical to `original` (a state dict)."""
    sd32 = ref.model32.state_dict()
    sd64 = ref.model64.state_dict()
    params = dict(ref.model32.named_parameters())
    for name in names or sd64:
        got, want32, want64 = state_dict[name], _numpy(sd32[name]), _numpy(sd64[name])
        if not np.issubdtype(np.asarray(want32).dtype, np.floating):
            assert np.array_equal(got, want32), name
            continue
        assert_fp64_close(got, want32, want64, name, factor, rel_floor)
        orig = _numpy(original[name])
        k = trained.get(name)
        if k is None and name in params:
            assert np.array_equal(got, orig), f"frozen parameter {name} changed"
        elif k is not None and k is not FULL:
            assert np.array_equal(got[:, k:], orig[:, k:]), f"frozen slice of {name} changed"


def assert_outputs_close(got, model32, model64, inputs, what="output", factor=FACTOR, rel_floor=REL_FLOOR):
    """Inference with trained weights: judged against both reference models run on `inputs`."""
    with torch.no_grad():
        want32 = model32(*inputs)
        want64 = model64(*to64(tuple(inputs)))
    assert_fp64_close(got, _numpy(want32), _numpy(want64), what, factor, rel_floor)
