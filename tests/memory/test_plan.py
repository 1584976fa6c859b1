"""The static memory plan: liveness, view aliasing, the no-overlap proof
(verify_plan) and what sparse updates keep alive."""
import copy

import pytest
import torch

import pockengine as pe
from models import MODELS, SPARSE, batches
from pockengine.ops import REGISTRY
from pockengine.memory.plan import ALIGN, MemoryPlan, plan_memory, root_of, verify_plan
from pockengine.passes.schedule import schedule

CASES = {
    "mlp-full": ("mlp", "full"),
    "mlp-sparse": ("mlp", {"net.0.weight": 0.25}),
    "cnn-sparse": ("cnn", SPARSE["cnn"]),
    "cnn-full": ("cnn", "full"),
    "gpt-full": ("gpt", "full"),
    "lstm-sparse": ("lstm", SPARSE["lstm"]),
}
_CACHE = {}


def prog(case):
    if case not in _CACHE:
        name, update = CASES[case]
        torch.manual_seed(0)
        inputs, targets = batches(name)[0]
        _CACHE[case] = pe.compile(MODELS[name](), inputs, targets, update=update,
                                  optimizer=pe.SGD(lr=0.1, momentum=0.9), exact_skip=False)  # reordered
    return _CACHE[case]


def plans(p):
    """(plan, order, graph, keep_to_end) of every plan a program holds."""
    g, fg = p.graph, p.forward_graph
    return [(p.plan, p.order, g, [g.loss]),
            (p.plan_no_reorder, schedule(g, reorder=False), g, [g.loss]),
            (p.forward_plan, p.forward_order, fg, fg.outputs)]


def first_backward(order):
    return min(i for i, n in enumerate(order) if n.phase == "backward")


def buffer_of(plan, v):
    """The buffer holding v: its own, its view source's, or the one it was computed in place into."""
    r = root_of(v)
    (b,) = [b for b in plan.buffers if b.value is r or any(a is r for a in b.aliases)]
    return b


def node(order, op, i=0):
    return [n for n in order if n.op == op][i]


@pytest.mark.parametrize("case", sorted(CASES))
def test_plans_verify_and_cover_every_arena_value(case):
    p = prog(case)
    for plan, order, g, _ in plans(p):
        verify_plan(plan)
        values = list(g.inputs) + list(g.targets) + [o for n in order for o in n.outputs if o is not None]
        assert values
        for v in values:
            off = plan.offset(v)
            assert off % ALIGN == 0
            assert 0 <= off and off + v.nbytes <= plan.arena_bytes, v
            assert buffer_of(plan, v).size >= v.nbytes
    assert p.stats()["arena_bytes"] == p.plan.arena_bytes


@pytest.mark.parametrize("case", sorted(CASES))
def test_liveness_is_exact(case):
    """Each buffer lives from its definition to its last use (through views), no longer."""
    p = prog(case)
    for plan, order, g, keep in plans(p):
        for b in plan.buffers:
            members = [b.value] + b.aliases
            ids = {id(v) for v in members}
            first = -1 if b.value.kind in ("input", "target") else order.index(b.value.producer)
            uses = [i for i, n in enumerate(order) if any(v is not None and id(v) in ids for v in n.inputs)]
            uses += [order.index(a.producer) for a in b.aliases]
            last = max(uses + [first])
            if any(id(v) in ids for v in keep):
                last = len(order)
            assert (b.first, b.last) == (first, last), b.value


def test_corrupted_plan_is_rejected():
    p = prog("mlp-full")
    plan = p.plan
    bufs = plan.buffers
    together = [(a, b) for a in bufs for b in bufs
                if a is not b and a.first <= b.last and b.first <= a.last]
    assert together
    a, b = together[0]
    assert a.offset + a.size <= b.offset or b.offset + b.size <= a.offset  # disjoint in the real plan

    moved = [copy.copy(x) for x in bufs]
    victim = moved[bufs.index(b)]
    victim.offset = a.offset
    bad = MemoryPlan(moved, dict(plan.offsets), max(plan.arena_bytes, a.offset + b.size))
    with pytest.raises(AssertionError, match="alive together and overlap") as info:
        verify_plan(bad)
    assert repr(a.value) in str(info.value) and repr(b.value) in str(info.value)

    # a one-byte overlap is enough
    moved = [copy.copy(x) for x in bufs]
    victim = moved[bufs.index(b)]
    victim.offset = a.offset + a.size - 1
    with pytest.raises(AssertionError, match="overlap"):
        verify_plan(MemoryPlan(moved, {}, victim.offset + victim.size + plan.arena_bytes))

    # a buffer past the end of the arena
    moved = [copy.copy(x) for x in bufs]
    moved[0].offset = plan.arena_bytes
    with pytest.raises(AssertionError, match="outside the arena"):
        verify_plan(MemoryPlan(moved, {}, plan.arena_bytes))

    # the real plan is untouched and still valid
    verify_plan(plan)


def test_sharing_storage_across_disjoint_lifetimes_is_accepted():
    p = prog("mlp-full")
    bufs = p.plan.buffers
    apart = [(a, b) for a in bufs for b in bufs if a.last < b.first and a.size == b.size]
    assert apart
    a, b = apart[0]
    moved = [copy.copy(x) for x in bufs]
    moved[bufs.index(b)].offset = a.offset
    verify_plan(MemoryPlan(moved, {}, p.plan.arena_bytes))  # no error: they are never alive together


def test_forward_only_activation_is_dead_before_backward():
    p = prog("cnn-full")
    order, plan = p.order, p.plan
    fb = first_backward(order)
    pool = node(order, "max_pool2d")
    residual = pool.inputs[0]  # x + bn3(...): only max_pool2d reads it (its backward uses the indices)
    readers = [n for n in order if residual in n.inputs]
    assert [n.op for n in readers] == ["max_pool2d"]
    assert buffer_of(plan, residual).last == order.index(pool) < fb
    # ... whereas the pooled output is saved (adaptive pooling's input is not, but the fc input is)
    fc_in = node(order, "linear").inputs[0]
    assert buffer_of(plan, fc_in).last >= fb


# (in the MLP every value the fused forward computes is saved for the backward)
@pytest.mark.parametrize("case", sorted(c for c in CASES if c != "mlp-full"))
def test_every_forward_only_value_is_dead_before_backward(case):
    p = prog(case)
    checked = 0
    for order in (p.order, schedule(p.graph, reorder=False)):
        # liveness itself (in-place sharing would merge forward-only values into saved ones)
        plan = plan_memory(order, p.graph, [p.graph.loss], in_place=False)
        fb = first_backward(order)
        for b in plan.buffers:
            ids = {id(v) for v in [b.value] + b.aliases}
            readers = [n for n in order if any(v is not None and id(v) in ids for v in n.inputs)]
            if readers and all(n.phase == "forward" for n in readers) and id(p.graph.loss) not in ids:
                assert b.last < fb, b.value
                checked += 1
    assert checked >= 2


def test_dead_activation_storage_is_reused_by_backward():
    p = prog("cnn-full")
    order = p.order
    plan = plan_memory(order, p.graph, [p.graph.loss], in_place=False)
    fb = first_backward(order)
    dead = [b for b in plan.buffers if b.last < fb]
    bwd = [b for b in plan.buffers if b.first >= fb]
    assert any(d.offset < b.offset + b.size and b.offset < d.offset + d.size for d in dead for b in bwd)


def test_reshape_view_shares_its_source_offset():
    p = prog("cnn-full")
    seen = 0
    for plan, order, g, _ in plans(p):
        for n in order:
            if n.op != "reshape" or n.inputs[0].in_state:
                continue
            assert REGISTRY["reshape"].view
            src, view = n.inputs[0], n.out
            assert plan.offset(view) == plan.offset(src)
            assert all(b.value is not view for b in plan.buffers)  # no storage of its own
            b = buffer_of(plan, src)
            assert view in b.aliases
            view_uses = [i for i, m in enumerate(order) if view in m.inputs]
            assert b.last >= max(view_uses + [order.index(n)])  # the source lives as long as the view
            seen += 1
    assert seen >= 3


def test_arena_holds_the_largest_live_set():
    for case in CASES:
        p = prog(case)
        for plan, order, g, _ in plans(p):
            steps = range(-1, len(order) + 1)
            live = [sum(b.size for b in plan.buffers if b.first <= t <= b.last) for t in steps]
            peak = max(live)
            assert peak > 0
            assert plan.arena_bytes >= peak, case
            assert plan.arena_bytes <= sum(b.size for b in plan.buffers)


def test_reordering_never_needs_more_arena():
    for case in CASES:
        s = prog(case).stats()
        assert s["arena_bytes"] <= s["arena_bytes_no_reorder"], case
    s = prog("gpt-full").stats()
    assert s["arena_bytes"] < s["arena_bytes_no_reorder"]


def test_exact_skip_keeps_every_gradient_to_the_end():
    """The exact non-finite guard (the default) runs the updates after the whole backward
    pass: the step's plan is the unreordered one."""
    name, update = CASES["gpt-full"]
    torch.manual_seed(0)
    p = pe.compile(MODELS[name](), *batches(name)[0], update=update, optimizer=pe.SGD(lr=0.1, momentum=0.9))
    s = p.stats()
    assert s["exact_skip"] and s["arena_bytes"] == s["arena_bytes_no_reorder"] > prog("gpt-full").stats()["arena_bytes"]
    verify_plan(p.plan)
    fb = max(i for i, n in enumerate(p.order) if n.phase == "backward")
    assert all(i > fb for i, n in enumerate(p.order) if n.phase == "update")


def test_sparse_update_keeps_only_a_slice_of_the_input():
    p = prog("mlp-sparse")
    order, plan, g = p.order, p.plan, p.graph
    (x,) = g.inputs
    (saved,) = [n for n in order if n.attrs.get("hoist")]
    assert saved.op == "slice" and saved.inputs[0] is x
    assert tuple(saved.out.shape) == (8, 4)  # ceil(0.25 * 16) input channels of net.0.weight
    wgrad = node(order, "linear_bwd_weight")
    assert wgrad.inputs[1] is saved.out
    fb = first_backward(order)
    assert all(n.phase == "forward" for n in order if x in n.inputs)
    assert buffer_of(plan, x).last < fb  # the full (8, 16) input is gone before the backward
    sb = buffer_of(plan, saved.out)
    assert sb.size == 128 and sb.last == order.index(wgrad) >= fb
    # what survives into the backward from the forward: the slice and the activations it needs, not x
    kept = {b.value.name for b in plan.buffers if b.first < fb <= b.last}
    assert x.name not in kept and saved.out.name in kept


def test_sparse_update_keeps_only_a_slice_of_an_activation():
    p = prog("cnn-sparse")
    order, plan = p.order, p.plan
    (saved,) = [n for n in order if n.attrs.get("hoist")]
    act = saved.inputs[0]
    assert tuple(act.shape) == (4, 16, 8, 8) and tuple(saved.out.shape) == (4, 8, 8, 8)
    fb = first_backward(order)
    assert buffer_of(plan, act).last < fb
    assert buffer_of(plan, saved.out).last >= fb
    full = prog("cnn-full")
    assert buffer_of(full.plan, [n for n in full.order if n.source.startswith("project")][0].inputs[0]).last \
        >= first_backward(full.order)  # with a full update the whole activation is kept


def test_plan_memory_is_deterministic():
    p = prog("mlp-full")
    order = schedule(p.graph, reorder=True)
    plan = plan_memory(order, p.graph, [p.graph.loss])
    assert plan.arena_bytes == p.plan.arena_bytes
    assert [b.offset for b in plan.buffers] == [b.offset for b in p.plan.buffers]  # deterministic


def test_in_place_ops_reuse_a_dying_input_and_shrink_the_arena():
    p = prog("gpt-full")
    order, plan = p.order, p.plan
    ce_bwd = node(order, "cross_entropy_bwd")
    logits = ce_bwd.inputs[1]
    assert buffer_of(plan, ce_bwd.out) is buffer_of(plan, logits)  # dlogits overwrite the logits
    # the tied embedding's rows summed onto the head's gradient, in that gradient's buffer
    tied_sum = [n for n in order if n.op == "embedding_bwd" and len(n.inputs) == 3]
    assert tied_sum and buffer_of(plan, tied_sum[0].out) is buffer_of(plan, tied_sum[0].inputs[2])
    assert tied_sum[0].inputs[2].producer.op == "linear_bwd_weight"
    no_inplace = plan_memory(order, p.graph, [p.graph.loss], in_place=False)
    verify_plan(no_inplace)
    assert plan.arena_bytes <= no_inplace.arena_bytes
    # with a real vocabulary the logits set the peak: overwriting them with dlogits lowers it
    torch.manual_seed(0)
    x, y = torch.randint(0, 2000, (1, 32)), torch.randint(0, 2000, (1, 32))
    big = pe.compile(MODELS["gpt"](vocab=2000, d=64, seq=32), (x,), (y,), optimizer=pe.SGD(lr=0.1))
    big_no_inplace = plan_memory(big.order, big.graph, [big.graph.loss], in_place=False)
    assert big.plan.arena_bytes < 0.9 * big_no_inplace.arena_bytes
    # never in place over an input that is still read later
    for b in plan.buffers:
        for v in b.aliases:
            n = v.producer
            if n is not None and not REGISTRY[n.op].view:
                src = [x for x in n.inputs if x is not None and not x.in_state and buffer_of(plan, x) is b]
                for x in src:
                    later = [m for m in order[order.index(n) + 1:] if x in m.inputs]
                    assert not later, (n, x)
