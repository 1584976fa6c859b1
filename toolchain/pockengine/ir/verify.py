"""The IR verifier: runs after every stage that produces or rewrites a graph."""
from __future__ import annotations

from .graph import ARENA_KINDS, DTYPE_BYTES, STATE_KINDS, Graph
from ..ops import REGISTRY, infer


class IRError(AssertionError):
    """The compiler broke one of the IR's invariants (a PockEngine bug)."""


def verify(g: Graph, stage: str = "") -> Graph:
    where = f" after {stage}" if stage else ""
    defined: set[int] = {id(v) for v in g.inputs + g.targets} | {id(v) for v in g.state.values()}
    names: set[str] = set()

    def fail(msg):
        raise IRError(f"IR verification failed{where}: {msg}")

    for v in g.inputs + g.targets:
        if v.kind not in ARENA_KINDS:
            fail(f"input {v!r} has kind {v.kind}")
    for name, v in g.state.items():
        if v.kind not in STATE_KINDS or v.name != name:
            fail(f"state tensor {name} is {v!r} of kind {v.kind}")
    for n in g.nodes:
        if n.op not in REGISTRY:
            fail(f"unknown op {n.op}")
        for v in n.inputs:
            if v is not None and id(v) not in defined:
                fail(f"{n!r} reads {v!r} before it is defined")
        try:
            specs = infer(n.op, n.inputs, n.attrs)
        except Exception as e:  # noqa: BLE001 - re-raised with context
            fail(f"{n!r}: shape inference failed: {e}")
        if len(specs) != len(n.outputs):
            fail(f"{n!r} has {len(n.outputs)} outputs, op defines {len(specs)}")
        for o, (shape, dtype) in zip(n.outputs, specs):
            if o is None:
                continue
            if id(o) in defined:
                fail(f"{o!r} is defined twice (not SSA)")
            if o.shape != shape or o.dtype != dtype:
                fail(f"{n!r}: output {o!r} should be {dtype}{list(shape)}")
            if o.producer is not n or o.kind != "temp" or o.dtype not in DTYPE_BYTES:
                fail(f"{o!r} has a wrong producer or kind")
            if o.name in names:
                fail(f"value name {o.name} reused")
            names.add(o.name)
            defined.add(id(o))
        for m in n.mutates:
            if m is None or not m.in_state:
                fail(f"{n!r} writes {m!r}, which is not a state tensor")
    if g.loss is not None and (id(g.loss) not in defined or g.loss.shape != () or g.loss.dtype != "f32"):
        fail(f"loss {g.loss!r} is not a defined f32 scalar")
    for v in g.outputs:
        if id(v) not in defined:
            fail(f"output {v!r} is not defined")
    return g
