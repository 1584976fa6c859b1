"""The op records' gradient rules and CPU calls cover every op."""
from pockengine.backends.cpu import check_coverage
from pockengine.ops import REGISTRY

# ops that only appear in backward passes, write state or move data between backends
# (inserted after autodiff): they need no gradient rule
NO_RULE = ({op for op in REGISTRY if "_bwd" in op} | {"assign", "sgd_update", "adamw_update"}
           | {op for op, r in REGISTRY.items() if r.transfer})


def test_every_op_has_a_cpu_emitter():
    assert check_coverage() == []
    assert all(r.cpu is not None for r in REGISTRY.values() if not r.transfer)


def test_every_forward_op_has_a_gradient_rule():
    missing = sorted(op for op, r in REGISTRY.items() if op not in NO_RULE and r.grad is None)
    assert missing == []
