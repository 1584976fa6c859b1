"""Vulkan backend: the trainable part of the step as GLSL compute shaders.

    trainer = prog.build(backends=["vulkan", "cpu"])   # -> compile_vulkan + load_trainer (build/package.py)

The partitioner (passes/partition.py) puts every node that has a shader here
(`supports`) on Vulkan and the rest on the CPU, with explicit transfer nodes.
Each Vulkan node becomes one or more dispatches (emitters below, forward and
backward side by side); each run of consecutive Vulkan nodes is one command
buffer, recorded once when the device opens and re-submitted every step: a
segment of codegen's one step loop (VulkanSegments; the loop, the guard, the CPU
nodes and the memory plan are codegen's), rendered from templates/vulkan.cpp.j2.
Device memory is one host-visible buffer (native/runtime/vulkan/pock_vulkan.h):

    [scalars: lr, step, AdamW factors | device arena (the step plan's "vulkan" space) | state mirror]

Parameters and optimizer state stay authoritative in the host state (so
state_dict, checkpoints and inference are unchanged): the step copies the
state its Vulkan nodes use into the mirror at the start and copies what they
updated back at the end (state_transfer nodes).  Inference runs on the CPU.
"""
from __future__ import annotations

import math
from pathlib import Path

from ..errors import PockError
from ..ir.graph import Node, Value
from ..memory.plan import ALIGN, root_of
from ..ops.cpp import _fit, bcast_strides, strides
from ..codegen import Segments, Source, render as render_step, segmented_step
from ..passes.partition import ALWAYS, partition
from . import vulkan_conv  # noqa: F401  (registers the conv2d, batch norm and pooling emitters)
from ..codegen import EmitOptions
from .vulkan_ops import BACKWARD_BASE, BINARY, POINTWISE
from .vulkan_dispatch import (EMITTERS, NONE, WG, WORDS, Dispatch, _f32, _n, copy_dispatch, emitter,  # noqa: F401
                              fbits, fill_dispatch, grid, ibits, reduce_dispatch)


class VkEmit:
    """Word offsets (4-byte units into the one Vulkan buffer) for a node's values."""

    def __init__(self, word):
        self.w = lambda v: NONE if v is None else word(v)

    def node(self, n: Node) -> list[Dispatch]:
        fn = EMITTERS.get(n.op)
        if fn is None:
            raise NotImplementedError(f"no Vulkan shader for op '{n.op}'")
        return fn(self, n)


def supports(n: Node) -> bool:
    """Whether node n has a Vulkan shader (its dtypes and shapes included)."""
    if n.op not in EMITTERS:
        return False
    try:
        VkEmit(lambda v: 0).node(n)
    except NotImplementedError:
        return False
    return True


# ---- GEMM: linear forward and both backward products, matmul ----------------------------------
def gemm(a0, ars, acs, b0, brs, bcs, c0, ldc, M, N, K, bias=NONE, act=0, batch=1, sa=0, sb=0, sc=0, acc=0):
    push = [a0, ars, acs, b0, brs, bcs, c0, ldc, M, N, K, bias, act, sa, sb, sc, acc]
    return Dispatch("gemm", (math.ceil(N / 8), math.ceil(M / 8), batch), push)


ACT = {None: 0, "relu": 1, "relu6": 2}


@emitter("linear")
def _linear(e, n):           # y[M,N] = act(x[M,K] @ w[N,K]^T + b)
    x, w, bias = n.inputs
    _f32(x, w, bias)
    N, K = w.shape
    return [gemm(e.w(x), K, 1, e.w(w), 1, K, e.w(n.outputs[0]), N, _n(x) // K, N, K, e.w(bias),
                 ACT[n.attrs.get("act")])]


@emitter("linear_bwd_input")
def _linear_bi(e, n):        # dx[M,K] = dy[M,N] @ w[N,K]
    dy, w = n.inputs
    N, K = w.shape
    return [gemm(e.w(dy), N, 1, e.w(w), K, 1, e.w(n.outputs[0]), K, _n(dy) // N, K, N)]


@emitter("linear_bwd_weight")
def _linear_bw(e, n):        # dw[N,k] = dy[M,N]^T @ x[M, 0:k]
    dy, xs = n.inputs
    N, ldx, k = dy.shape[-1], xs.shape[-1], n.attrs["k"]
    return [gemm(e.w(dy), 1, N, e.w(xs), ldx, 1, e.w(n.outputs[0]), k, N, k, _n(dy) // N)]


@emitter("bias_bwd")
def _bias_bwd(e, n):         # db[N] = column sums of dy[M,N]
    dy = n.inputs[0]
    N = dy.shape[-1]
    return [reduce_dispatch(e.w(dy), e.w(n.outputs[0]), [_n(dy) // N, N], [True, False], 1.0)]


@emitter("matmul")
def _matmul(e, n):
    A, B, C = (v.shape for v in (n.inputs[0], n.inputs[1], n.outputs[0]))
    _f32(*n.inputs)
    M, N = C[-2:]
    ta, tb = n.attrs.get("ta", False), n.attrs.get("tb", False)
    K = A[-2] if ta else A[-1]
    batch = math.prod(C[:-2])
    sa = M * K if math.prod(A[:-2]) > 1 else 0
    sb = K * N if math.prod(B[:-2]) > 1 else 0
    ars, acs = (1, M) if ta else (K, 1)
    brs, bcs = (1, K) if tb else (N, 1)
    return [gemm(e.w(n.inputs[0]), ars, acs, e.w(n.inputs[1]), brs, bcs, e.w(n.outputs[0]), N, M, N, K,
                 batch=batch, sa=sa, sb=sb, sc=M * N)]


# ---- pointwise: forward op codes < 32, backward >= 32 (pointwise.comp; codes in vulkan_ops.py) --------------
UNARY = {op: c for op, c in POINTWISE.items() if c < BACKWARD_BASE and not op.startswith("gelu")}
GRAD = {op: c for op, c in POINTWISE.items() if c >= BACKWARD_BASE and not op.startswith("gelu")}


def pointwise(op, x, s, y, count, c0=0.0, c1=0.0):
    return Dispatch("pointwise", grid(count), [op, x, s, y, count, fbits(c0), fbits(c1)])


@emitter(*UNARY, "gelu")
def _unary(e, n):
    x, y = n.inputs[0], n.outputs[0]
    if n.op == "add_scalar" and x.dtype == "i64":
        from .vulkan_conv import add_i64
        return add_i64(e, n)
    _f32(x)
    a = n.attrs
    op = POINTWISE["gelu_tanh" if a["approximate"] else "gelu"] if n.op == "gelu" else UNARY[n.op]
    c0, c1 = (a["lo"], a["hi"]) if n.op == "hardtanh" else (a.get("c", 0.0), 0.0)
    return [pointwise(op, e.w(x), NONE, e.w(y), _n(x), c0, c1)]


@emitter(*GRAD, "gelu_bwd")
def _unary_bwd(e, n):
    dy, s = n.inputs
    _f32(dy, s)
    a = n.attrs
    op = POINTWISE["gelu_tanh_bwd" if a["approximate"] else "gelu_bwd"] if n.op == "gelu_bwd" else GRAD[n.op]
    c0, c1 = (a["lo"], a["hi"]) if n.op == "hardtanh_bwd" else (0.0, 0.0)
    return [pointwise(op, e.w(dy), e.w(s), e.w(n.outputs[0]), _n(dy), c0, c1)]


@emitter(*BINARY)
def _binary(e, n):
    _f32(*n.inputs)
    out = n.outputs[0].shape
    nd, shape, (sa, sb) = _fit(out, bcast_strides(n.inputs[0].shape, out), bcast_strides(n.inputs[1].shape, out))
    op = BINARY[n.op]
    push = [op, e.w(n.inputs[0]), e.w(n.inputs[1]), e.w(n.outputs[0]), nd, *shape, *sa, *sb]
    return [Dispatch("binary", grid(math.prod(out)), push)]


# ---- reductions ---------------------------------------------------------------------------------
@emitter("sum", "mean")
def _sum(e, n):
    x = n.inputs[0]
    _f32(x)
    dims = n.attrs["dims"]
    count = math.prod(x.shape[d] for d in dims)
    scale = 1.0 / count if n.op == "mean" and count else 1.0
    return [reduce_dispatch(e.w(x), e.w(n.outputs[0]), x.shape, [d in dims for d in range(len(x.shape))], scale)]


@emitter("sum_to")
def _sum_to(e, n):
    x = n.inputs[0]
    _f32(x)
    xs, target = x.shape, n.attrs["shape"]
    padded = (1,) * (len(xs) - len(target)) + tuple(target)
    flags = [padded[d] == 1 and xs[d] != 1 for d in range(len(xs))]
    return [reduce_dispatch(e.w(x), e.w(n.outputs[0]), xs, flags, 1.0)]


# ---- layout: strided copies and fills (copy.comp) -----------------------------------------------------
@emitter("reshape")
def _reshape(e, n):
    return []  # a view: the output shares the input's words


@emitter("permute")
def _permute(e, n):
    xs, out = strides(n.inputs[0].shape), n.outputs[0].shape
    return [copy_dispatch(n.outputs[0].dtype, e.w(n.inputs[0]), e.w(n.outputs[0]), out,
                          [xs[p] for p in n.attrs["perm"]], 0, strides(out), 0)]


@emitter("expand")
def _expand(e, n):
    out = n.outputs[0].shape
    return [copy_dispatch(n.outputs[0].dtype, e.w(n.inputs[0]), e.w(n.outputs[0]), out,
                          bcast_strides(n.inputs[0].shape, out), 0, strides(out), 0)]


@emitter("slice")
def _slice(e, n):
    a, xs = n.attrs, strides(n.inputs[0].shape)
    ins = list(xs)
    ins[a["dim"]] *= a["step"]
    out = n.outputs[0].shape
    return [copy_dispatch(n.outputs[0].dtype, e.w(n.inputs[0]), e.w(n.outputs[0]), out, ins,
                          a["start"] * xs[a["dim"]], strides(out), 0)]


@emitter("slice_bwd")
def _slice_bwd(e, n):
    a, dy = n.attrs, n.inputs[0]
    xs = strides(a["x_shape"])
    outs = list(xs)
    outs[a["dim"]] *= a["step"]
    dx = e.w(n.outputs[0])
    return [fill_dispatch("f32", dx, math.prod(a["x_shape"]), 0.0),
            copy_dispatch("f32", e.w(dy), dx, dy.shape, strides(dy.shape), 0, outs, a["start"] * xs[a["dim"]])]


@emitter("cat")
def _cat(e, n):
    dim, ys = n.attrs["dim"], strides(n.outputs[0].shape)
    out, at = [], 0
    for v in n.inputs:
        out.append(copy_dispatch(v.dtype, e.w(v), e.w(n.outputs[0]), v.shape, strides(v.shape), 0, ys,
                                 at * ys[dim]))
        at += v.shape[dim]
    return out


@emitter("full")
def _full(e, n):
    v = n.outputs[0]
    return [fill_dispatch(v.dtype, e.w(v), _n(v), n.attrs["value"])]


# ---- embedding, LayerNorm, cross-entropy: forward and backward side by side ---------------------------
def embedding_dispatch(mode, count, w=NONE, idx=NONE, y=NONE, n=0, V=0, D=0, k=0, pad=-1, dy=NONE, dw=NONE,
                       err=NONE, base=NONE):
    return Dispatch("embedding", grid(count), [mode, w, idx, y, n, V, D, k, ibits(pad), dy, dw, err, base])


def index_word(e, n) -> int:
    """The scalars-block word where gather n's shader records an index out of range (the
    host checks it after the segment: VulkanSegments.end), or NONE outside a rendered step."""
    return e.index_slot(n) if hasattr(e, "index_slot") else NONE


@emitter("embedding")
def _embedding(e, n):        # y[i] = w[idx[i]]
    w, idx = n.inputs
    _f32(w)
    V, D = w.shape
    if idx.dtype != "i64":
        raise NotImplementedError("embedding indices must be int64 on Vulkan")
    return [embedding_dispatch(0, _n(idx) * D, w=e.w(w), idx=e.w(idx), y=e.w(n.outputs[0]), n=_n(idx), V=V, D=D,
                               err=index_word(e, n))]


@emitter("embedding_bwd")
def _embedding_bwd(e, n):    # dw[v, :k] = (base[v, :k] +) sum over idx[i] == v of dy[i, :k]
    dy, idx, *base = n.inputs
    a = n.attrs
    if idx.dtype != "i64":
        raise NotImplementedError("embedding indices must be int64 on Vulkan")
    V, k = a["num_weights"], a["k"]
    return [embedding_dispatch(1, V * k, idx=e.w(idx), n=_n(idx), V=V, D=dy.shape[-1], k=k, pad=a["padding_idx"],
                               dy=e.w(dy), dw=e.w(n.outputs[0]), base=e.w(base[0]) if base else NONE)]


def _rows_cols(x: Value, nd: int):
    cols = math.prod(x.shape[len(x.shape) - nd:])
    return _n(x) // cols, cols


@emitter("layer_norm")
def _ln(e, n):               # y = (x - mean) * rstd * w + b; saves mean, rstd
    x, w, bias = n.inputs
    y, mean, rstd = n.outputs
    rows, cols = _rows_cols(x, n.attrs["normalized_ndim"])
    push = [0, e.w(x), e.w(w), e.w(bias), e.w(y), e.w(mean), e.w(rstd), rows, cols, fbits(n.attrs["eps"]),
            NONE, NONE, NONE]
    return [Dispatch("layer_norm", grid(rows), push)]


@emitter("layer_norm_bwd")
def _ln_bwd(e, n):           # dx per row; dw, db per column
    dy, x, mean, rstd, w = n.inputs
    dx, dw, db = n.outputs
    rows, cols = _rows_cols(x, len(n.attrs["w_shape"]))
    base = [e.w(x), e.w(w), NONE, e.w(dx), e.w(mean), e.w(rstd), rows, cols, 0, e.w(dy), e.w(dw), e.w(db)]
    out = []
    if dx is not None:
        out.append(Dispatch("layer_norm", grid(rows), [1, *base]))
    if dw is not None or db is not None:
        out.append(Dispatch("layer_norm", grid(cols), [2, *base]))
    return out


@emitter("rms_norm")
def _rms(e, n):              # y = w * (x * r); saves r per row
    x, w = n.inputs
    y, rstd = n.outputs
    _f32(x, w)
    rows, cols = _rows_cols(x, 1)
    push = [0, e.w(x), e.w(w), e.w(y), e.w(rstd), rows, cols, fbits(n.attrs["eps"]), NONE, NONE]
    return [Dispatch("rms_norm", grid(rows), push)]


@emitter("rms_norm_bwd")
def _rms_bwd(e, n):          # dx per row; dw per column
    dy, x, rstd, w = n.inputs
    dx, dw = n.outputs
    rows, cols = _rows_cols(x, 1)
    base = [e.w(x), e.w(w), e.w(dx), e.w(rstd), rows, cols, 0, e.w(dy), e.w(dw)]
    out = []
    if dx is not None:
        out.append(Dispatch("rms_norm", grid(rows), [1, *base]))
    if dw is not None:
        out.append(Dispatch("rms_norm", grid(cols), [2, *base]))
    return out


@emitter("swiglu")
def _swiglu(e, n):           # y = silu(gate) * up
    gate, up = n.inputs
    _f32(gate, up)
    return [Dispatch("swiglu", grid(_n(gate)), [0, e.w(gate), e.w(up), e.w(n.outputs[0]), _n(gate), NONE, NONE, NONE])]


@emitter("swiglu_bwd")
def _swiglu_bwd(e, n):       # dgate, dup from dy, gate, up
    dy, gate, up = n.inputs
    dgate, dup = n.outputs
    return [Dispatch("swiglu", grid(_n(gate)), [1, e.w(gate), e.w(up), NONE, _n(gate), e.w(dy), e.w(dgate),
                                                 e.w(dup)])]


def _rope_dispatch(e, mode, n):
    """mode 0: y from x (rope); 1: dx from dy (rope_bwd). Inputs (x or dy, cos, sin), output 0."""
    a, cos, sin = n.inputs
    _f32(a, cos, sin)
    at = n.attrs
    return [Dispatch("rope", grid(_n(a) // 2), [mode, e.w(a), e.w(cos), e.w(sin), e.w(n.outputs[0]), at["outer"],
                                                at["rep"], at["inner"], a.shape[-1], at["cos_outer"],
                                                at.get("tmajor", 0)])]


@emitter("rope")
def _rope(e, n):             # y = x * cos + rotate_half(x) * sin
    return _rope_dispatch(e, 0, n)


@emitter("rope_bwd")
def _rope_bwd(e, n):         # dx = dy * cos + rotate_half^T(dy * sin)
    return _rope_dispatch(e, 1, n)


def ce_dispatch(mode, count, logits, target, out, N, C, a, dloss=NONE, err=NONE):
    push = [mode, logits, target, out, N, C, ibits(a["ignore_index"]), fbits(a["label_smoothing"]), dloss, err]
    return Dispatch("cross_entropy", (1, 1, 1) if mode == 0 else grid(count), push)


@emitter("cross_entropy")
def _ce(e, n):               # loss = mean over valid rows of logsumexp - logit[target] (+ smoothing)
    logits, target = n.inputs
    if target.dtype != "i64":
        raise NotImplementedError("cross-entropy targets must be int64 on Vulkan")
    N, C = logits.shape
    return [ce_dispatch(0, 1, e.w(logits), e.w(target), e.w(n.outputs[0]), N, C, n.attrs, err=index_word(e, n))]


@emitter("cross_entropy_bwd")
def _ce_bwd(e, n):           # dlogits = dloss/cnt * (softmax - (1-ls) onehot - ls/C)
    dloss, logits, target = n.inputs
    if target.dtype != "i64":
        raise NotImplementedError("cross-entropy targets must be int64 on Vulkan")
    N, C = logits.shape
    return [ce_dispatch(1, N, e.w(logits), e.w(target), e.w(n.outputs[0]), N, C, n.attrs, e.w(dloss))]


# ---- optimizer updates (optimizer.comp); the scalars block is at word 0 -------------------------------
ADAMW_SLOT0 = 16  # words: [0] lr, [1] step, then 8 floats per AdamW node from word 16


def _region(n: Node) -> tuple[int, int, int]:
    outer, inner, stride = n.attrs["region"]
    return outer, inner, stride


@emitter("sgd_update")
def _sgd(e, n):
    p, g, buf = n.inputs
    a = n.attrs
    outer, inner, stride = _region(n)
    push = [0, e.w(p), e.w(g), e.w(buf), NONE, outer, inner, stride, fbits(a["momentum"]),
            fbits(1.0 - a["dampening"]), fbits(a["weight_decay"]), int(a["nesterov"])]
    return [Dispatch("optimizer", grid(outer * inner), push)]


@emitter("adamw_update")
def _adamw(e, n):
    p, g, m, v = n.inputs
    outer, inner, stride = _region(n)
    slot = e.adamw_slot(n) if hasattr(e, "adamw_slot") else 0
    push = [1, e.w(p), e.w(g), e.w(m), e.w(v), outer, inner, stride, slot]
    return [Dispatch("optimizer", grid(outer * inner), push)]


# ---- rendering the step ---------------------------------------------------------------------------------
GATHERS = {"embedding": ("embedding", lambda n: n.inputs[0].shape[0]),
           "cross_entropy": ("cross_entropy target", lambda n: n.inputs[0].shape[1])}


def gather_check(n: Node, err_byte: int, ids_byte: int) -> str:
    """The host's check after the segment that ran gather n: its shader recorded the first
    index out of range (and read nothing with it); the step fails as the CPU's would."""
    from ..ops.cpp import _origin, cstr
    what, hi = GATHERS[n.op]
    where = f"{what} in {n.source}" if n.source else what
    return (f"if (const uint32_t bad = *reinterpret_cast<const uint32_t*>(D + {err_byte}); bad != 0xFFFFFFFFu) "
            f"return pock_index_error({cstr(where)}, {cstr(_origin(n.inputs[1]))}, "
            f"reinterpret_cast<const int64_t*>(D + {ids_byte}), bad, 0, {hi(n)});")


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


WINDOW_SHIFT = 28  # common.glsl: an operand is (window << 28) | word when there are several windows
WINDOW_ALIGN = 256  # the largest minStorageBufferOffsetAlignment the Vulkan spec allows


def plan_windows(extents, total: int, limit: int):
    """Windows [(offset, size)] over D's `total` bytes, each at most `limit` bytes and starting
    WINDOW_ALIGN-aligned (a multiple of any device's minStorageBufferOffsetAlignment), so that every extent
    (start, end, name) lies inside one; and {(start, end): window}.  One window [0, total) when
    it fits.  Windows may overlap; window 0 starts at 0 (the scalars)."""
    from ..build.vulkan import MAX_WINDOWS
    if total <= limit:
        return [(0, total)], {(a, b): 0 for a, b, _ in extents}
    starts, window_of = [0], {}
    for a, b, name in sorted(set(extents)):
        if b - starts[-1] > limit:
            starts.append(a // WINDOW_ALIGN * WINDOW_ALIGN)
        if b - starts[-1] > limit:
            raise PockError(f"tensor '{name}' ({b - a} bytes) does not fit one Vulkan buffer binding of "
                            f"{limit} bytes (POCK_VK_MAX_BUFFER_BYTES; at most 2**30)")
        window_of[(a, b)] = len(starts) - 1
    if len(starts) > MAX_WINDOWS:
        raise PockError(f"the step needs {len(starts)} Vulkan buffer bindings of at most {limit} bytes for its "
                        f"{total} bytes; the shaders bind at most {MAX_WINDOWS} (raise POCK_VK_MAX_BUFFER_BYTES "
                        f"where the device binds more)")
    return [(s, min(s + limit, total) - s) for s in starts], window_of


def partition_step(prog, backends=("vulkan", "cpu"), cost=None):
    """The program's training step partitioned over `backends`: by the cost model when one
    is given, else every node Vulkan has a shader for goes to Vulkan."""
    return partition(prog.order, prog.graph, list(backends), {"vulkan": supports}, cost,
                     prefer=None if cost is not None else "vulkan")


class VulkanSegments(Segments):
    """The Vulkan side of a partitioned step for codegen's one loop (codegen.Segments): each
    Vulkan node is recorded as dispatches (kDispatches); a segment is one command buffer,
    recorded once when the device opens, run by pvk::run (submit and wait) at its end, after
    which the host checks the gathers it ran.  Transfers are memcpy's between the host's
    arena or state and D, the host-visible Vulkan buffer:

        [scalars: lr, step, AdamW factors, gather error words | device arena | state mirror]

    The device arena is the plan's "vulkan" space (memory.plan.plan_spaces)."""

    name = "vulkan"
    template = "vulkan.cpp.j2"  # extends model.cpp.j2

    def __init__(self, prog, part, plans, emit):
        from ..build.vulkan import window_bytes
        super().__init__(prog, part, plans, emit)
        pg = part.graph
        self.host, dev, so = plans[ALWAYS], plans.get("vulkan"), prog.state_offsets
        mine = [n for n in pg.nodes if self.runs(n)]
        self.adamw_nodes = [n for n in mine if n.op == "adamw_update"]
        # gathers on Vulkan: one error word each after the AdamW slots (see index_word)
        self.gathers = [n for n in mine if n.op in GATHERS]
        self.index_slot0 = ADAMW_SLOT0 + 8 * len(self.adamw_nodes)
        self.arena_base = _align(4 * (self.index_slot0 + len(self.gathers)))
        self.state_base = self.arena_base + _align(dev.arena_bytes if dev else 0)
        self.device_bytes = self.state_base + max(prog.state_bytes, 64)

        def word(v: Value) -> int:  # D's word of v, as the host sees it
            r = root_of(v)
            return (self.state_base + so[r.name]) // 4 if r.in_state else (self.arena_base + dev.offset(v)) // 4
        self.word = word
        # The shaders' view of D: windows of at most window_bytes() each (every tensor inside one).
        used: dict[int, Value] = {}

        def record(v: Value) -> int:
            used[id(v)] = v
            return 0
        probe = VkEmit(record)
        for n in mine:
            probe.node(n)
        self.windows, self.window_of = plan_windows([self.extent(v) for v in used.values()], self.device_bytes,
                                                    window_bytes())
        self.vk = VkEmit(self.shader_word)
        self.vk.adamw_slot = lambda n: ADAMW_SLOT0 + 8 * self.adamw_nodes.index(n)
        self.vk.index_slot = lambda n: self.index_slot0 + self.gathers.index(n)
        self.shaders: list[str] = []
        self.dispatches: list[dict] = []
        self.segments: list[dict] = []
        self.recorded: list[Node] = []  # the gathers of the open segment

    def extent(self, v: Value) -> tuple[int, int, str]:  # bytes of D that v's storage (its root) spans
        r = root_of(v)
        return (4 * self.word(r), 4 * self.word(r) + r.nbytes, r.name)

    def shader_word(self, v: Value) -> int:  # (window << 28) | word in that window; D's word with one window
        w = self.window_of[self.extent(v)[:2]]
        return (w << WINDOW_SHIFT) | (self.word(v) - self.windows[w][0] // 4)

    def host_ptr(self, v: Value) -> str:
        r = root_of(v)
        if r.in_state:
            return f"F32(S, {self.prog.state_offsets[r.name]})"
        if self.on_host(v):
            return f"F32(A, {self.host.offset(v)})"
        return f"reinterpret_cast<const float*>(D + {4 * self.word(v)})"

    def _bytes(self, v: Value) -> str:  # v's bytes where its backend keeps them
        r = root_of(v)
        so = self.prog.state_offsets
        if self.on_host(v):
            return f"S + {so[r.name]}" if r.in_state else f"A + {self.host.offset(v)}"
        return f"D + {4 * self.word(v)}"

    def begin(self) -> list[str]:
        self.segments.append({"first": len(self.dispatches), "count": 0})
        self.recorded = []
        return []

    def node(self, i: int, n: Node) -> tuple[list[str], str]:
        ds = self.vk.node(n)
        for d in ds:
            if d.shader not in self.shaders:
                self.shaders.append(d.shader)
            push = list(d.push) + [0] * (32 - len(d.push))
            self.dispatches.append({"node": i, "shader": self.shaders.index(d.shader), "groups": list(d.groups),
                                    "push": [f"{int(x) & 0xFFFFFFFF}u" for x in push]})
        self.segments[-1]["count"] += len(ds)
        if n.op in GATHERS:
            self.recorded.append(n)
        names = ", ".join(sorted({d.shader for d in ds})) or "none (a view)"
        kernel = "vk:" + "+".join(dict.fromkeys(d.shader for d in ds)) if ds else "view"
        return [f"// vulkan: {len(ds)} dispatch(es) #{len(self.dispatches) - len(ds)}.. ({names})"], kernel

    def end(self) -> list[str]:
        k, count = len(self.segments) - 1, self.segments[-1]["count"]
        lines = [f"if (!pvk::run(vk, {k})) {{ *F32(A, {self.host.offset(self.part.graph.loss)}) = NAN; "
                 f"return pock_rt::fail(POCK_ERR_BACKEND, \"Vulkan segment {k} failed\"); }}"
                 f"  // Vulkan segment {k}: {count} dispatches"]
        lines += [gather_check(g, 4 * (self.index_slot0 + self.gathers.index(g)), 4 * self.word(g.inputs[1]))
                  for g in self.recorded]
        return lines

    def transfer(self, n: Node) -> list[str]:
        v = n.inputs[0]
        if n.op == "state_transfer":  # the host's state <-> its mirror in D
            so = self.prog.state_offsets
            dev, host = f"D + {self.state_base + so[v.name]}", f"S + {so[v.name]}"
            dst, src = (dev, host) if n.attrs["dst"] != ALWAYS else (host, dev)
            return [f"std::memcpy({dst}, {src}, {v.nbytes});  // state {v.name}: {n.attrs['src']} -> {n.attrs['dst']}"]
        return [f"std::memcpy({self._bytes(n.outputs[0])}, {self._bytes(v)}, {v.nbytes});  "
                f"// {n.attrs['src']} -> {n.attrs['dst']}"]

    def context(self) -> dict:
        """vulkan.cpp.j2's context: the tables, the head of train_step, the device hooks."""
        from ..build.vulkan import compile_shader
        from ..ops.cpp import fl
        part = self.part
        adamw = []
        for k, n in enumerate(self.adamw_nodes):
            a = n.attrs
            adamw.append({"offset": 4 * (ADAMW_SLOT0 + 8 * k),
                          "args": f"{fl(a['beta1'])}, {fl(a['beta2'])}, {fl(a['eps'])}, {fl(a['weight_decay'])}"})
        return {
            "partition_summary": ", ".join(f"{b} {len(part.nodes_on(b))} nodes" for b in part.backends),
            "device_arena_base": self.arena_base, "device_state_base": self.state_base,
            "device_bytes": self.device_bytes, "windows": self.windows,
            "shaders": [{"name": s, "words": compile_shader(s, len(self.windows))} for s in self.shaders],
            "dispatches": self.dispatches, "segments": self.segments, "adamw": adamw,
            "index_words": [4 * (self.index_slot0 + i) for i in range(len(self.gathers))],
        }


def render(prog, part, options: EmitOptions | None = None):
    """(C++ source, hash) of the step with its Vulkan partition: codegen's one step loop with
    VulkanSegments (codegen.segmented_step), rendered from vulkan.cpp.j2."""
    return render_step(prog, segmented_step(prog, part, VulkanSegments, options), options)


def emit_vulkan(prog, backends=("vulkan", "cpu"), cost=None, options: EmitOptions | None = None):
    """The step with its Vulkan partition, as a codegen.Source."""
    part = partition_step(prog, backends, cost)
    text, digest = render(prog, part, options)
    return Source(text, digest, tuple(backends), part)


# ---- building and loading ----------------------------------------------------------------------------------
def compile_vulkan(prog, source, out_dir=None) -> Path:
    """The host library of `source` (an emit_vulkan result): the step with the Vulkan runtime,
    linked to the Vulkan loader."""
    from ..build.host import build_shared_library, cache_dir, write_source
    from ..build.vulkan import LINK_FLAGS, runtime_sources, vulkan_dir

    src_dir = Path(out_dir) if out_dir else cache_dir() / "models"
    path = write_source(src_dir / f"{prog.name}-vk-{source.hash}.cpp", source.text)
    return build_shared_library([path, *runtime_sources()], src_dir, ("-I", str(vulkan_dir()), *LINK_FLAGS))


def open_backend(lib_path) -> None:
    """Open the library's Vulkan device; PockError naming what is missing when there is none."""
    import ctypes

    from ..runtime.trainer import _load_library

    lib = _load_library(lib_path)
    fn = lib.pock_backend_open
    fn.restype, fn.argtypes = ctypes.c_int32, []
    if fn() != 0:
        raise PockError(lib.pock_last_error().decode())


def VulkanTrainer(lib_path, checkpoint=None, *, aliases=None):  # noqa: N802  (the old class's name)
    """A Trainer whose library runs part of the step on Vulkan: the device opens first."""
    from ..runtime.trainer import Trainer
    return Trainer(lib_path, checkpoint, aliases=aliases, open_device=open_backend)


# ---- registration (backends/__init__.py) -------------------------------------------------------------------
from . import Backend, Device, register  # noqa: E402


def _check_soc(soc) -> None:
    if not soc.vulkan:
        raise PockError(f"--backends vulkan needs a SoC with a Vulkan GPU; {soc.name} has none")


register(Backend(
    "vulkan",
    # ten times the CPU's arithmetic; a dispatch inside a recorded command buffer costs little,
    # a submission and wait costs more
    Device(flops_per_s=200e9, dispatch_s=1e-6, handover_s=30e-6),
    supports=supports,
    emit=lambda prog, cost=None, options=None: emit_vulkan(prog, cost=cost, options=options),  # over ("vulkan", "cpu")
    compile=compile_vulkan,
    open=open_backend, check_target=_check_soc,
    platforms=("host",),
    doc="the trainable part of the step as SPIR-V compute shaders (native/runtime/vulkan)"))
