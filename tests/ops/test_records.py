"""The op records (pockengine/ops): each is complete, no other table of ops is kept beside
the one registry, and every kernel a record's CPU call names is declared in pock_kernels.h."""
import re
from pathlib import Path

import importlib

from pockengine.ops import REGISTRY, OpRecord, get
from pockengine.ops.kernels import kernels_of

HEADER = Path(__file__).resolve().parents[2] / "native" / "runtime" / "include" / "pock_kernels.h"

# Forward ops without a torch reference: a frozen prefix (HTP, Core ML) stops at them. Giving
# one a reference lets the prefix take it in: a decision to make, not a default.
NO_TORCH_REFERENCE = {
    "batch_norm_train": "computes batch statistics and writes the running ones",
    "dropout": "draws random numbers",
    "lstm": "not in the prefix's ONNX export yet", "gru": "not in the prefix's ONNX export yet",
    "rms_norm": "not in the prefix's ONNX export yet", "swiglu": "not in the prefix's ONNX export yet",
    "compare": "integer bookkeeping", "cast": "integer bookkeeping", "cumsum": "integer bookkeeping",
    "cos": "rotary tables are constants", "sin": "rotary tables are constants",
    "sum_to": "only in backward passes",
    "cross_entropy": "a loss", "nll_loss": "a loss", "mse_loss": "a loss",
    "linear_cross_entropy": "a loss (the LM head fused with it, passes/lm_head.py)",
}


def test_each_record_is_registered_under_its_name():
    assert len(REGISTRY) > 90
    for name, r in REGISTRY.items():
        assert isinstance(r, OpRecord) and r.name == name and callable(r.infer) and callable(r.flops), name
        assert get(name) is r


def test_every_op_has_a_gradient_rule_or_is_declared_non_differentiable():
    for name, r in REGISTRY.items():
        assert (r.grad is not None) == r.differentiable, name
        assert not r.partial or r.grad is not None, name
    not_differentiable = {name for name, r in REGISTRY.items() if not r.differentiable}
    assert not_differentiable == ({op for op in REGISTRY if "_bwd" in op}
                                  | {"assign", "sgd_update", "adamw_update"}
                                  | {op for op, r in REGISTRY.items() if r.transfer})


def test_every_forward_op_has_a_torch_reference_or_a_reason():
    for name, r in REGISTRY.items():
        if r.differentiable and name not in NO_TORCH_REFERENCE:
            assert r.torch is not None, f"{name} has no torch reference (or add it to NO_TORCH_REFERENCE)"
        if name in NO_TORCH_REFERENCE:
            assert r.torch is None, f"{name} has a torch reference now: take it out of NO_TORCH_REFERENCE"
        assert r.torch_outputs >= 1, name


def test_training_only_ops_have_a_torch_train_reference():
    """The reference backend runs every forward op of a step from its record: `torch`, or
    `torch_train` for the ops a frozen prefix must not take (losses, train-mode BatchNorm)."""
    for name, r in REGISTRY.items():
        assert r.torch is None or r.torch_train is None, f"{name}: one torch reference, not two"
    assert {n for n, r in REGISTRY.items() if r.torch_train} == {"cross_entropy", "nll_loss", "mse_loss",
                                                               "batch_norm_train", "linear_cross_entropy"}


def test_every_op_but_the_transfers_has_a_cpu_call():
    for name, r in REGISTRY.items():
        assert (r.cpu is None) == r.transfer, name


# the tables the records replaced (issue 35): every pass reads the records themselves
OLD_TABLES = {"pockengine.backends.cpu": ["EMITTERS"], "pockengine.passes.prefix": ["TORCH_OPS", "LAYOUT_OPS"],
              "pockengine.compiler.program": ["FLOAT_ONLY_OPS"], "pockengine.passes.fuse": ["FUSABLE"],
              "pockengine.passes.lowp": ["DEQUANT_USES"], "pockengine.passes.partition": ["OPS", "TRANSFER_OPS"],
              "pockengine.memory.plan": ["OPS", "INPLACE"], "pockengine.autodiff.backward": ["RULES", "PARTIAL"]}


def test_no_table_of_ops_besides_the_registry():
    for module, names in OLD_TABLES.items():
        m = importlib.import_module(module)
        assert [n for n in names if hasattr(m, n)] == [], module
    for module in ("pockengine.ir.ops", "pockengine.autodiff.rules"):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError:
            continue
        raise AssertionError(f"{module} is back: read the op records (pockengine.ops.REGISTRY)")
    for name, r in REGISTRY.items():  # in-place and mutated inputs exist; a view aliases input 0
        assert all(i >= 0 for i in r.inplace + r.mutates), name
        assert not (r.view and r.inplace), name


def test_every_kernel_a_cpu_call_names_is_declared_in_pock_kernels_h():
    declared = set(re.findall(r"\b([A-Za-z_]\w*)\s*[({<]", HEADER.read_text())) | set(
        re.findall(r"\b(?:enum class|struct|using)\s+(\w+)", HEADER.read_text()))
    named = {name: kernels_of(r) for name, r in REGISTRY.items() if r.cpu is not None}
    missing = {op: sorted(k - declared) for op, k in named.items() if k - declared}
    assert missing == {}
    assert sorted(op for op, k in named.items() if not k) == ["assign", "reshape"]  # memcpy; a view
    assert {"linear_fwd", "linear_fwd_act", "layer_norm_fwd", "relu_fwd", "add_scalar", "first_bad_index",
            "strided_copy", "reduce_sum", "sgd_update"} <= set().union(*named.values())


def test_the_vulkan_backends_ops_are_registered_ops():
    """Vulkan keeps its own per-node emitters and shader op codes (backends/vulkan*.py); each
    names an op of the registry (gelu's tanh form has its own code)."""
    from pockengine.backends.vulkan_dispatch import EMITTERS as VULKAN
    from pockengine.backends.vulkan_ops import BINARY, POINTWISE

    assert set(VULKAN) <= set(REGISTRY), sorted(set(VULKAN) - set(REGISTRY))
    assert {op.replace("gelu_tanh", "gelu") for op in POINTWISE} | set(BINARY) <= set(VULKAN)
