"""Dropout and the losses (cross_entropy, nll_loss, mse_loss), with their backward ops."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..ir.graph import Value
from .cpp import _n, fl, index_check
from .record import OpRecord, bwd, k_of as _k, register
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


# ---- linear_cross_entropy: the LM head and its loss fused (passes/lm_head.py), no logits -------
# inputs (x [..., K], w [V, K], bias [V] or None, target [M]); outputs the loss, each row's
# log-sum-exp [M] (for the backward) and the scratch of one tile of logits (attrs rows x cols).
def _lce_dims(x, w):
    from .cpp import _wshape
    V, K = _wshape(w)
    return numel(x) // K, V, K


def _lce(i, a):
    M, _, K = _lce_dims(i[0], i[1])
    if "dx" not in a:
        return [((), "f32"), ((M,), "f32"), ((a["rows"] * a["cols"],), "f32")]
    # with the input gradient of the unit loss gradient (passes/lm_head.head_dx_in_forward): a tile
    # and a low-precision tile's dx product
    return [((), "f32"), ((M,), "f32"), ((a["rows"] * (a["cols"] + K),), "f32"), (i[0].shape, "f32")]


def _lce_flops(i, o, a):
    M, V, K = _lce_dims(i[0], i[1])
    return (2 * M * V * K + 5 * M * V) * (2 if "dx" in a else 1)  # with dx: its product and the exps


def _lce_grad(b, n, g, need):
    x, w, bias, target = n.inputs
    k = _k(need[1], w.shape[1]) if need[1] else w.shape[1]
    dx, dw, db, _ = b.add("linear_cross_entropy_bwd", [g[0], x, w, bias, target, n.outputs[1]], {**n.attrs, "k": k},
                          wanted=[bool(need[0]), bool(need[1]), bool(need[2]), True])
    return [dx, dw, db, None]


def lce_params(n, x: Value, w: Value, k=None) -> str:
    from .cpp import LOWP
    M, V, K = _lce_dims(x, w)
    a = n.attrs
    lowp = f", true, static_cast<int>({LOWP[w.dtype]})" if w.dtype in LOWP else ""
    return f"{{{M}, {V}, {K}, {K if k is None else k}, {a['ignore_index']}, {a['rows']}, {a['cols']}{lowp}}}"


def _lce_w(e, w: Value, ptr: str) -> tuple[str, str]:
    """(weight pointer, scale pointer) of the head's weight (low precision: lowp.cpp's)."""
    from .cpp import LOWP
    if w.dtype in LOWP:  # as cpp._lowp, whose 'w, dtype, scale' cannot be split at commas (F32(S, off))
        return e.p(w), (f"F32(S, {e.state_offset[w.name + ':scale']})" if w.dtype in ("i8", "q4") else "nullptr")
    return ptr, "nullptr"


def _target_check(n, target: str, V: int) -> str:
    """cross_entropy's index check of the targets (input 3 here, not 1)."""
    import copy
    view = copy.copy(n)
    view.inputs = [n.inputs[0], n.inputs[3]]
    return index_check(view, target, "cross_entropy target", V, n.attrs["ignore_index"])


def _lce_cpu(e, n, x, w, bias, target, loss, lse, scratch, dx=None):
    wp, scale = _lce_w(e, n.inputs[1], w)
    _, V, _ = _lce_dims(n.inputs[0], n.inputs[1])
    if "dx" in n.attrs:  # the frozen head's input gradient in the same pass (of dx * loss)
        return [_target_check(n, target, V),
                f"pk::linear_ce_fwd_dx({x}, {wp}, {scale}, {bias}, {target}, {loss}, {lse}, {dx}, "
                f"1.0f, {scratch}, {lce_params(n, n.inputs[0], n.inputs[1])});"]
    return [_target_check(n, target, V),
            f"pk::linear_ce_fwd({x}, {wp}, {scale}, {bias}, {target}, {loss}, {lse}, {scratch}, "
            f"{lce_params(n, n.inputs[0], n.inputs[1])});"]


def _lce_bwd_cpu(e, n, dloss, x, w, bias, target, lse, *rest):
    if n.attrs.get("dx_in_forward"):  # dx of the unit loss gradient from the forward, scaled
        dx1, dx = rest[0], rest[1]
        return f"pk::linear_ce_bwd_scale({dloss}, {dx1}, {dx}, {numel(n.inputs[1])});"
    dx, dw, db, scratch = rest
    wp, scale = _lce_w(e, n.inputs[2], w)
    return (f"pk::linear_ce_bwd({dloss}, {x}, {wp}, {scale}, {bias}, {target}, {lse}, {dx}, {dw}, {db}, {scratch}, "
            f"{lce_params(n, n.inputs[1], n.inputs[2], n.attrs['k'])});")


def _lce_bwd_flops(i, o, a):
    """The recomputed logits' product and one product per gradient wanted (dx, dW: the kernel
    skips a null one; a head trained alone wants no dx); with dx_in_forward only the scaling."""
    if a.get("dx_in_forward"):
        return numel(i[1])
    return (1 + (o[0] is not None) + (o[1] is not None)) * _lce_flops(i[1:3], o, a)


def _lce_torch(i, a):
    x, w, bias, t = i
    y = F.linear(x, w, bias)
    y = y.reshape(-1, y.shape[-1])
    loss = F.cross_entropy(y, t.reshape(-1).long(), ignore_index=a["ignore_index"])
    if "dx" not in a:
        return [loss, torch.logsumexp(y, -1), y.new_zeros(a["rows"] * a["cols"])]
    with torch.enable_grad():  # the input gradient of the loss, as the fused kernel gives it
        xg = x.detach().requires_grad_()
        yg = F.linear(xg, w.detach(), None if bias is None else bias.detach())
        lg = F.cross_entropy(yg.reshape(-1, yg.shape[-1]), t.reshape(-1).long(), ignore_index=a["ignore_index"])
        dx, = torch.autograd.grad(lg, xg)
    return [loss, torch.logsumexp(y, -1), y.new_zeros(a["rows"] * (a["cols"] + x.shape[-1])), dx]


register(
    OpRecord("linear_cross_entropy", _lce, _lce_flops, grad=_lce_grad, partial=frozenset({1}), lowp_inputs=(1,),
             torch_train=_lce_torch, cpu=_lce_cpu),
    # recomputes each tile of logits from x, w and the saved lse; scratch: a tile and (a low-precision
    # weight) its dx product.  attrs["dx_in_forward"] (passes/lm_head.head_dx_in_forward): input 6 is
    # the forward's dx of the unit loss gradient, scaled here (no dw, no db, no scratch)
    bwd("linear_cross_entropy_bwd",
        lambda i, a: [(i[1].shape, "f32"), ((i[2].shape[0], a["k"]), "f32"), ((i[2].shape[0],), "f32"),
                      ((1,) if a.get("dx_in_forward") else (a["rows"] * (a["cols"] + i[1].shape[-1]),), "f32")],
        _lce_bwd_flops, lowp_inputs=(2,),
        cpu=_lce_bwd_cpu),
)
