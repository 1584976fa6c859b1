"""Compile-time reverse-mode autodiff over the IR.

Only what the update needs is built: a forward walk marks the values that
depend on a trained parameter, a backward walk from the loss keeps the nodes
on a path between them, and gradients are emitted for exactly those nodes.
A parameter used several times (tied weights) receives the sum of its
gradients (sum_grads: an embedding's row scatter sums onto the other use's).
Partial updates (need = k) get gradients of shape (shape[0], k, ...).

The gradient rules live in the op records (pockengine/ops, `OpRecord.grad`):
rule(b, node, gouts, need) -> one gradient (or None) per input. `gouts[i]` is the
gradient flowing into output i (None: nothing flows); `need[i]` is None (input i needs
no gradient), FULL, or an int k: only the first k slices along dim 1 of that parameter
are trained. Only the inputs in a record's `partial` get k itself (the rule computes just
that slice, saving just the activation slice it needs); for every other input the driver
asks for FULL and slices the result.
"""
from __future__ import annotations

from ..errors import PockError
from ..ir.graph import Graph, Node, Value, dependents
from ..ops import FULL, REGISTRY


class GradBuilder:
    """What a rule uses to emit backward nodes (all tagged with the forward node's source)."""

    def __init__(self, g: Graph):
        self.g = g
        self.node: Node | None = None
        self._slices: dict[tuple, Value] = {}

    def add(self, op, inputs, attrs=None, wanted=None):
        return self.g.add(op, inputs, attrs, source=self.node.source, phase="backward", wanted=wanted,
                          name=f"d_{op}")

    def reshape(self, v: Value, shape) -> Value:
        shape = tuple(shape)
        return v if v.shape == shape else self.add("reshape", [v], {"shape": shape})

    def expand(self, v: Value, shape) -> Value:
        shape = tuple(shape)
        return v if v.shape == shape else self.add("expand", [v], {"shape": shape})

    def sum_to(self, v: Value, shape) -> Value:
        shape = tuple(shape)
        return v if v.shape == shape else self.add("sum_to", [v], {"shape": shape})

    def zeros(self, shape) -> Value:
        return self.add("full", [], {"shape": tuple(shape), "value": 0.0, "dtype": "f32"})

    def saved_slice(self, x: Value, dim: int, k: int) -> Value:
        """x[..., :k] along dim, computed in the forward pass right after x, so
        the step keeps only the slice for the backward (not all of x)."""
        if x.shape[dim] == k:
            return x
        key = (id(x), dim, k)
        if key not in self._slices:
            self._slices[key] = self.g.add("slice", [x], {"dim": dim, "start": 0, "end": k, "step": 1,
                                                          "hoist": True},
                                           source=self.node.source, phase="forward", name=f"{x.name}_saved")
        return self._slices[key]

    def unsupported(self, what):
        raise PockError(f"{what} is not supported (in {self.node.source or 'the model'})")


def sum_grads(b: GradBuilder, old: Value, new: Value) -> Value:
    """old + new: two uses' gradients of one value (tied weights). A table's row scatter just
    emitted for the new use (embedding_bwd, e.g. a tied LM's input embedding, whose head use
    came first in the backward walk) is re-emitted summing its rows onto `old` (its base
    input): no zero-filled [vocab, dim] buffer of its own and no pass adding it, only its rows
    touched."""
    n = new.producer
    if (n is not None and n.op == "embedding_bwd" and len(n.inputs) == 2 and b.g.nodes and b.g.nodes[-1] is n
            and old.shape == new.shape and old.dtype == new.dtype):
        b.g.nodes.pop()
        return b.add("embedding_bwd", [*n.inputs, old], n.attrs)
    return b.add("add", [old, new])


def requires_grad(g: Graph, trained: set[int]) -> set[int]:
    """ids of the values that depend on a trained parameter (float ones, not past a
    stop_gradient): ir.graph.dependents."""
    return dependents(g.nodes, trained,
                      lambda n, o: o.dtype == "f32" and not (n.op == "reshape" and n.attrs.get("stop_gradient")))


def build_backward(g: Graph, trained: dict[str, object]) -> dict[str, Value]:
    """Append the backward pass to g. trained: param name -> FULL or k.
    Returns param name -> gradient value (params the loss does not reach are absent)."""
    if g.loss is None:
        raise PockError("the training graph has no loss")
    params = {id(g.state[name]): name for name in trained}
    req = requires_grad(g, set(params))
    if id(g.loss) not in req:
        return {}
    b = GradBuilder(g)
    forward = [n for n in g.nodes if n.phase == "forward"]
    b.node = g.loss.producer
    grads: dict[int, Value] = {id(g.loss): b.add("full", [], {"shape": (), "value": 1.0, "dtype": "f32"})}
    for n in reversed(forward):
        gouts = [grads.get(id(o)) if o is not None else None for o in n.outputs]
        if all(x is None for x in gouts):
            continue
        need = []
        for i, v in enumerate(n.inputs):
            if v is None or id(v) not in req or v.dtype != "f32":
                need.append(None)
            elif id(v) in params:
                k = trained[params[id(v)]]
                need.append(k if (k is FULL or i in REGISTRY[n.op].partial) else FULL)
            else:
                need.append(FULL)
        if not any(need):
            continue
        fn = REGISTRY[n.op].grad if n.op in REGISTRY else None
        if fn is None:
            raise PockError(f"no gradient rule for op '{n.op}' (in {n.source or 'the model'})")
        b.node = n
        gins = fn(b, n, gouts, need)
        for v, nd, gv in zip(n.inputs, need, gins):
            if nd is None or gv is None:
                continue
            if id(v) in params:
                k = trained[params[id(v)]]
                if k is not FULL and gv.shape[1] != k:  # the rule computed it all: keep the slice
                    gv = b.add("slice", [gv], {"dim": 1, "start": 0, "end": k, "step": 1})
            if id(v) in grads:
                gv = sum_grads(b, grads[id(v)], gv)
            grads[id(v)] = gv
    return {name: grads[pid] for pid, name in params.items() if pid in grads}
