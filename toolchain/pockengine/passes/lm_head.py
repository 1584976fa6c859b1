"""A language model's loss head without its logits (training graph only, before autodiff).

A `linear` (the LM head) whose output reaches only a `cross_entropy` (directly or through a
reshape to [tokens, vocabulary]) becomes one `linear_cross_entropy` node (ops/loss.py,
kernels/linear_ce.cpp): forward and backward run over tiles of rows x classes, so the tokens x
vocabulary logits and their gradient never exist in the step's arena.  Its gradient rule gives
dx, dW (a tied head's dW is summed with the embedding's gradient as before, autodiff's
sum_grads: embedding_bwd onto it) and db; a frozen head's dx alone comes from the forward's own pass
(head_dx_in_forward, after autodiff: no logits recomputed).  The inference graph keeps its plain linear, so
trainer.forward still returns the logits.  Label smoothing, and a classifier's head (input
[batch, features], not [batch, tokens, hidden]), and logits that fit in four tiles (MIN_LOGITS)
keep the unfused pair."""
from __future__ import annotations

from ..ir.graph import Graph

ROWS = 512  # rows of logits per tile (at most the tokens): all 288 of a 6 x 48 batch in one tile (256
#             cut them 256 + 32, the 32-row GEMMs ~15% slower on the head's forward, AVX2, one thread)
TILE = 1 << 20  # floats per tile of logits (4 MiB): the classes per tile follow
MIN_LOGITS = 4 * TILE  # fuse only logits bigger than four tiles (16 MiB); the tests set 0 to fuse tiny
#   models' heads.  The fused backward recomputes the logits (a fourth head GEMM), which a smaller
#   head pays for more than its memory saves: the keyboard transformer LM of `make bench` (8 x 64
#   tokens, vocab 8000, 15.6 MiB of logits) unfused takes 21% (full) / 20% (last) less CPU per step
#   on one thread (278 vs 353 ms, 134 vs 168 ms; bench/models.py, AVX2, issue 39), the held-out-like
#   LM (6 x 48 tokens, vocab 6000, 6.6 MiB) 12% (full) / 16% (sparse) (bench/lm_interleaved.py's
#   model).  SmolLM2's head (128 tokens x vocab 49152, 24 MiB of logits) stays fused.


def tile(tokens: int, vocab: int) -> tuple[int, int]:
    rows = max(1, min(tokens, ROWS))
    cols = max(1, min(vocab, TILE // rows // 64 * 64 or 64))
    return rows, cols


def fuse_lm_head(g: Graph) -> Graph:
    users = g.users()
    outputs = {id(v) for v in g.outputs}
    for n in list(g.nodes):
        if n.op != "cross_entropy" or n.attrs.get("label_smoothing", 0.0) != 0.0 or len(n.inputs[0].shape) != 2 \
                or n.inputs[0].shape[0] * n.inputs[0].shape[1] <= MIN_LOGITS:
            continue
        logits, target = n.inputs
        chain, v = [], logits
        while v.producer is not None and v.producer.op == "reshape" and not v.producer.attrs.get("stop_gradient"):
            chain.append(v.producer)
            v = v.producer.inputs[0]
        lin = v.producer
        if lin is None or lin.op != "linear" or lin.attrs.get("act") or v.shape[-1] != logits.shape[-1] \
                or len(lin.inputs[0].shape) < 3:  # a head over [batch, tokens, hidden] (a classifier's stays)
            continue
        values = [v] + [c.outputs[0] for c in chain]
        readers = {u for x in values for u in users.get(id(x), [])}
        if readers != {n, *chain} or any(id(x) in outputs for x in values) or len(users.get(id(logits), [])) != 1:
            continue
        x, w, bias = lin.inputs
        rows, cols = tile(logits.shape[0], logits.shape[1])
        loss = n.outputs[0]
        lse, scratch = (g.new_value(f"{loss.name}_{s}", shape, "f32") for s, shape in
                        (("lse", (logits.shape[0],)), ("tile", (rows * cols,))))
        n.op, n.inputs = "linear_cross_entropy", [x, w, bias, target]
        n.attrs = {"ignore_index": n.attrs["ignore_index"], "rows": rows, "cols": cols}
        n.outputs = [loss, lse, scratch]
        for o in n.outputs:
            o.producer = n
        g.nodes = [m for m in g.nodes if m is not lin and m not in chain]
    return g


def head_dx_in_forward(g: Graph) -> Graph:
    """A frozen head's input gradient in its forward (training graph, after autodiff and DCE).

    A `linear_cross_entropy_bwd` that gives only dx (no dW: the head is frozen, as in LoRA or a
    sparse update; no db) recomputes every tile of logits only to multiply their softmax by W.
    The forward node computes dx of the unit loss gradient in the same pass instead (attrs["dx"];
    kernels/linear_ce.cpp linear_ce_fwd_dx: an online softmax over the tiles, a new 4th output), and
    the backward node (attrs["dx_in_forward"], that output as its 7th input) only scales it by the
    loss gradient: the head runs two products per step instead of three (as PyTorch's), for one
    [tokens, hidden] buffer kept from the forward to the backward."""
    for nb in g.nodes:
        if nb.op != "linear_cross_entropy_bwd" or nb.attrs.get("dx_in_forward"):
            continue
        dx, dw, db, scratch = nb.outputs
        nf = nb.inputs[5].producer  # the saved lse's
        if dx is None or dw is not None or db is not None or nf is None or nf.op != "linear_cross_entropy" \
                or "dx" in nf.attrs or nf.inputs != nb.inputs[1:5]:
            continue
        x = nf.inputs[0]
        nf.attrs = {**nf.attrs, "dx": True}
        nf.outputs[2].shape = (nf.attrs["rows"] * (nf.attrs["cols"] + x.shape[-1]),)
        dx1 = g.new_value(f"{nf.outputs[0].name}_dx", x.shape, "f32")
        dx1.producer = nf
        nf.outputs.append(dx1)
        nb.inputs = nb.inputs + [dx1]
        nb.attrs = {**nb.attrs, "dx_in_forward": True}
        scratch.shape = (1,)
    return g


__all__ = ["MIN_LOGITS", "fuse_lm_head", "head_dx_in_forward", "tile"]
