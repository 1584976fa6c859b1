"""State writes (assign and the optimizer updates, which run in the update phase) and the
transfers between backends. None of them is differentiated."""
from __future__ import annotations

from .cpp import arr, b, fl
from .dense import linear_bw_args
from .record import OpRecord, register
from .shape import numel


def _assign_cpu(e, n, dst, src):
    return f"std::memcpy({dst}, {src}, {n.inputs[0].nbytes});"


# An update's call goes through e.update (codegen/emit.py: the non-finite guard around it).
def _sgd_cpu(e, n, p, g, buf):
    a = n.attrs
    return e.update(n, f"pk::sgd_update({p}, {g}, {buf}, {arr(a['region'])}, ctx->lr, {fl(a['momentum'])}, "
                    f"{fl(a['dampening'])}, {fl(a['weight_decay'])}, {b(a['nesterov'])}, ctx->step == 0")


def _adamw_cpu(e, n, p, g, m, v):
    a = n.attrs
    return e.update(n, f"pk::adamw_update({p}, {g}, {m}, {v}, {arr(a['region'])}, ctx->lr, {fl(a['beta1'])}, "
                    f"{fl(a['beta2'])}, {fl(a['eps'])}, {fl(a['weight_decay'])}, ctx->step + 1")



def fused_weight_update(e, n, u) -> tuple[str, ...]:
    """The lines of linear_bwd_weight node n with update node u (sgd_update or adamw_update
    of its gradient) fused into it: pk::linear_bwd_weight_sgd / _adamw, the update applied
    to each gradient tile as the GEMM finishes it (codegen.fusable_updates says when)."""
    gemm = linear_bw_args(n, e.p(n.inputs[0]), e.p(n.inputs[1]), e.p(n.outputs[0]))
    a = u.attrs
    p = e.p(u.inputs[0])
    if u.op == "sgd_update":
        return e.update(u, f"pk::linear_bwd_weight_sgd({gemm}, {p}, {e.p(u.inputs[2])}, {arr(a['region'])}, ctx->lr, "
                        f"{fl(a['momentum'])}, {fl(a['dampening'])}, {fl(a['weight_decay'])}, {b(a['nesterov'])}, "
                        f"ctx->step == 0")
    return e.update(u, f"pk::linear_bwd_weight_adamw({gemm}, {p}, {e.p(u.inputs[2])}, {e.p(u.inputs[3])}, "
                    f"{arr(a['region'])}, ctx->lr, {fl(a['beta1'])}, {fl(a['beta2'])}, {fl(a['eps'])}, "
                    f"{fl(a['weight_decay'])}, ctx->step + 1")


register(
    OpRecord("assign", lambda i, a: [], lambda i, o, a: 0, mutates=(0,), differentiable=False, cpu=_assign_cpu),
    OpRecord("sgd_update", lambda i, a: [], lambda i, o, a: 4 * numel(i[1]), mutates=(0, 2), differentiable=False,
             cpu=_sgd_cpu),
    OpRecord("adamw_update", lambda i, a: [], lambda i, o, a: 12 * numel(i[1]), mutates=(0, 2, 3),
             differentiable=False, cpu=_adamw_cpu),
)

# ---- data movement between backends ---------------------------------------------------------
# Inserted by the partitioner (passes/partition.py) after autodiff, so they need no gradient
# rule; the accelerator backend on either end emits them (backends/vulkan.py), never the CPU
# backend alone.
register(
    OpRecord("transfer", lambda i, a: [(i[0].shape, i[0].dtype)], lambda i, o, a: 0, differentiable=False,
             transfer=True),
    OpRecord("state_transfer", lambda i, a: [], lambda i, o, a: 0, differentiable=False, transfer=True),
)
