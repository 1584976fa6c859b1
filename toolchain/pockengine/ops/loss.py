"""Dropout and the losses (cross_entropy, nll_loss, mse_loss), with their backward ops."""
from __future__ import annotations

import torch.nn.functional as F

from .cpp import _n, fl, index_check
from .record import OpRecord, bwd, register
from .shape import ew as _ew, numel


def _dropout_cpu(e, n, x, y, mask):
    salt = int.from_bytes(n.outputs[0].name.encode()[-8:].ljust(8, b"\0"), "little")
    return (f"pk::dropout_fwd({x}, {y}, {mask}, {_n(n.inputs[0])}, {fl(n.attrs['p'])}, "
            f"ctx->seed ^ {salt}ull);")


register(
    OpRecord("dropout", lambda i, a: [(i[0].shape, "f32"), (i[0].shape, "u8")], _ew, float_only=True,
             grad=lambda b, n, g, need: [b.add("dropout_bwd", [g[0], n.outputs[1]], n.attrs)], cpu=_dropout_cpu),
    bwd("dropout_bwd", lambda i, a: [(i[0].shape, "f32")], _ew, inplace=(0,),
        cpu=lambda e, n, dy, mask, dx: f"pk::dropout_bwd({dy}, {mask}, {dx}, {_n(n.inputs[0])}, {fl(n.attrs['p'])});"),
)


# ---- cross_entropy and nll_loss (class-index targets) ------------------------------------
def _ce_cpu(e, n, logits, target, loss):
    N, C = n.inputs[0].shape
    a = n.attrs
    return [index_check(n, target, "cross_entropy target", C, a["ignore_index"]),
            f"pk::cross_entropy_fwd({logits}, {target}, {loss}, {N}, {C}, {a['ignore_index']}, "
            f"{fl(a['label_smoothing'])});"]


def _ce_bwd_cpu(e, n, dloss, logits, target, dlogits):
    N, C = n.inputs[1].shape
    a = n.attrs
    return (f"pk::cross_entropy_bwd({dloss}, {logits}, {target}, {dlogits}, {N}, {C}, {a['ignore_index']}, "
            f"{fl(a['label_smoothing'])});")


def _nll_cpu(e, n, logp, target, loss):
    N, C = n.inputs[0].shape
    return [index_check(n, target, "nll_loss target", C, n.attrs["ignore_index"]),
            f"pk::nll_loss_fwd({logp}, {target}, {loss}, {N}, {C}, {n.attrs['ignore_index']});"]


def _ce_torch(i, a):
    logits, y = i[0], i[1]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1).long(),
                           ignore_index=a.get("ignore_index", -100), label_smoothing=a.get("label_smoothing", 0.0))


def _nll_torch(i, a):
    logp, y = i[0], i[1]
    return F.nll_loss(logp.reshape(-1, logp.shape[-1]), y.reshape(-1).long(), ignore_index=a.get("ignore_index", -100))


def _nll_bwd_cpu(e, n, dloss, target, dlogp):
    N, C = n.outputs[0].shape
    return f"pk::nll_loss_bwd({dloss}, {target}, {dlogp}, {N}, {C}, {n.attrs['ignore_index']});"


register(
    OpRecord("cross_entropy", lambda i, a: [((), "f32")], lambda i, o, a: 5 * numel(i[0]),
             grad=lambda b, n, g, need: [b.add("cross_entropy_bwd", [g[0], n.inputs[0], n.inputs[1]], n.attrs), None],
             torch_train=_ce_torch, cpu=_ce_cpu),
    # the kernel reads a row of logits completely before it writes that row of the gradient
    bwd("cross_entropy_bwd", lambda i, a: [(i[1].shape, "f32")], lambda i, o, a: 5 * numel(i[1]), inplace=(1,),
        cpu=_ce_bwd_cpu),
    OpRecord("nll_loss", lambda i, a: [((), "f32")], lambda i, o, a: i[0].shape[0],
             grad=lambda b, n, g, need: [
                 b.add("nll_loss_bwd", [g[0], n.inputs[1]], n.attrs | {"classes": n.inputs[0].shape[1]}), None],
             torch_train=_nll_torch, cpu=_nll_cpu),
    bwd("nll_loss_bwd", lambda i, a: [((i[1].shape[0], a["classes"]), "f32")], lambda i, o, a: numel(o[0]),
        cpu=_nll_bwd_cpu),
)


# ---- mse_loss --------------------------------------------------------------------------------
def _mse_grad(b, n, g, need):
    return b.add("mse_loss_bwd", [g[0], n.inputs[0], n.inputs[1]], {}, wanted=[bool(need[0]), bool(need[1])])


register(
    OpRecord("mse_loss", lambda i, a: [((), "f32")], lambda i, o, a: 3 * numel(i[0]), float_only=True,
             grad=_mse_grad, torch_train=lambda i, a: F.mse_loss(i[0], i[1]),
             cpu=lambda e, n, a, c, loss: f"pk::mse_loss_fwd({a}, {c}, {loss}, {_n(n.inputs[0])});"),
    bwd("mse_loss_bwd", lambda i, a: [(i[1].shape, "f32"), (i[2].shape, "f32")], lambda i, o, a: 3 * numel(i[1]),
        cpu=lambda e, n, dl, a, c, da, dc: f"pk::mse_loss_bwd({dl}, {a}, {c}, {da}, {dc}, {_n(n.inputs[1])});"),
)
