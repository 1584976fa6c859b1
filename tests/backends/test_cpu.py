"""The op table, the gradient rules and the CPU emitters cover each other."""
from pockengine.autodiff.rules import RULES
from pockengine.backends.cpu import EMITTERS, check_coverage
from pockengine.ir.ops import OPS, TRANSFER_OPS

# ops that only appear in backward passes, write state or move data between backends
# (inserted after autodiff): they need no gradient rule
NO_RULE = {op for op in OPS if "_bwd" in op} | {"assign", "sgd_update", "adamw_update", *TRANSFER_OPS}


def test_every_op_has_a_cpu_emitter():
    assert check_coverage() == []
    assert set(EMITTERS) <= set(OPS), sorted(set(EMITTERS) - set(OPS))


def test_every_forward_op_has_a_gradient_rule():
    missing = sorted(op for op in OPS if op not in NO_RULE and op not in RULES)
    assert missing == []
    assert set(RULES) <= set(OPS), sorted(set(RULES) - set(OPS))
