"""PyTorch frontend: `torch.export` → PockEngine IR.

We export the model's training IR and run PyTorch's decompositions for every
op we do not convert ourselves (so `linear`, `conv2d`, `lstm`, `sdpa`,
`cross_entropy_loss` ... stay whole, and anything decomposable into them
still works). Buffer mutations (BatchNorm running statistics) come back
functionalised and become `assign` nodes. Each converter in `CONVERTERS`
turns one ATen op into IR nodes.
"""
from __future__ import annotations

import contextlib
import inspect
import io
import logging
import os
import re
import warnings
from collections.abc import Mapping

import numpy as np
import torch
import torch.nn as nn
from torch.export.graph_signature import InputKind, OutputKind

from ..errors import PockError
from ..ir.graph import Graph, Value
from ..ir.verify import verify
from ..passes.const_eval import fold_constants
from . import aten_ext, aten_more  # noqa: F401  (register the converters beyond the core set)
from .aten import _DTYPES, CONVERTERS, Ctx, module_path, to_ir_dtype

NUMPY = {"f32": np.float32, "i64": np.int64, "i32": np.int32, "u8": np.uint8}

aten = torch.ops.aten


def _call(model, args, input_names):
    if input_names:
        return model(**dict(zip(input_names, args)))
    return model(*args)


def select_output(out, output):
    """The tensor the loss (and trainer.forward) uses from a model's return value: `output`
    names a ModelOutput/dict key or a tuple index; None takes the first tuple item or the
    first dict/ModelOutput value (HF models put logits first when no labels are given)."""
    if output is None:
        if isinstance(out, (tuple, list)):
            return out[0]
        if isinstance(out, Mapping):
            return next(iter(out.values()))
        return out
    try:
        return out[output]
    except (KeyError, IndexError, TypeError) as e:
        keys = list(out.keys()) if isinstance(out, Mapping) else f"{len(out)} items" if isinstance(
            out, (tuple, list)) else type(out).__name__
        raise PockError(f"output={output!r} is not in the model's outputs ({keys})") from e


class _TrainStep(nn.Module):
    """model + loss as one module, so the loss is traced into the graph."""

    def __init__(self, model: nn.Module, loss_fn, n_inputs: int, output=None, input_names=None):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn
        self.n_inputs = n_inputs
        self.output = output
        self.input_names = input_names

    def forward(self, *args):
        out = _call(self.model, args[: self.n_inputs], self.input_names)
        if self.output is not None or self.input_names or isinstance(out, Mapping):
            out = select_output(out, self.output)
        return self.loss_fn(out, *args[self.n_inputs:])


class _TrainStepAndOutputs(_TrainStep):
    """The training step returning the model's outputs (those of _Inference) after the loss:
    one export gives both graphs (passes/inference.py)."""

    def forward(self, *args):
        out = _call(self.model, args[: self.n_inputs], self.input_names)
        if self.output is not None or self.input_names or isinstance(out, Mapping):
            out = select_output(out, self.output)
        return self.loss_fn(out, *args[self.n_inputs:]), out


class _Inference(nn.Module):
    def __init__(self, model: nn.Module, output=None, input_names=None):
        super().__init__()
        self.model = model
        self.output = output
        self.input_names = input_names

    def forward(self, *args):
        out = _call(self.model, args, self.input_names)
        if self.output is not None or self.input_names or isinstance(out, Mapping):
            out = select_output(out, self.output)
        return out


def _first(out):
    if isinstance(out, Mapping):  # a ModelOutput/dict: its first value (logits, for HF models without labels)
        return next(iter(out.values()))
    return out[0] if isinstance(out, (tuple, list)) else out


def _cross_entropy(out, y):
    logits = _first(out)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def _mse(out, y):
    return torch.nn.functional.mse_loss(_first(out), y)


LOSSES = {"cross_entropy": _cross_entropy, "mse": _mse}


def resolve_loss(loss):
    if callable(loss):
        return loss
    if loss in LOSSES:
        return LOSSES[loss]
    raise PockError(f"loss must be one of {sorted(LOSSES)} or a callable(outputs, *targets), got {loss!r}")


def _decomposition_table():
    table = torch.export.default_decompositions()
    for op in list(table.keys()):
        if op in CONVERTERS:
            del table[op]
    return table


def _export(module: nn.Module, args: tuple, what: str):
    try:
        with warnings.catch_warnings(), _quiet_torch_logs():
            warnings.simplefilter("ignore")
            ep = torch.export.export(module, args, strict=False)
            return ep.run_decompositions(_decomposition_table())
    except PockError:
        raise
    except Exception as e:  # torch raises many types; the user needs the reason
        branch = _data_dependent_branch(module, e)
        if branch:
            raise PockError(f"cannot compile the {what}: {branch}") from None
        raise PockError(f"torch.export could not trace the {what}: {type(e).__name__}: {e}") from e


@contextlib.contextmanager
def _quiet_torch_logs():
    """torch.export logs warnings and prints the whole graph (twice) before it raises on e.g. a
    data-dependent branch; the PockError says what matters, so they are held back meanwhile."""
    loggers = [logging.getLogger("torch")] + [logging.getLogger(n) for n in list(logging.root.manager.loggerDict)
                                              if n.startswith("torch.")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:  # (the graph is print()ed, by print_readable)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


_CALL_SITE = re.compile(r'File "([^"]+)", line (\d+), in (\w+)\n\s*(.*)')


def _data_dependent_branch(module: nn.Module, e: Exception) -> str | None:
    """For an `if`/`while`/`int()` on a tensor's value (torch's GuardOnDataDependentSymNode):
    where it is (module path, class, file:line, the code) and what to do instead."""
    text = str(e)
    if "data-dependent" not in text and type(e).__name__ != "GuardOnDataDependentSymNode":
        return None
    sites = _CALL_SITE.findall(text.split("The following call raised this error:", 1)[-1])
    if not sites:
        return None
    file, line, func, code = sites[0]
    where = f"{file}:{line}"
    for path, m in module.named_modules():
        fn = getattr(type(m), func, None)
        try:
            src, first = inspect.getsourcelines(fn)
            same = os.path.samefile(inspect.getsourcefile(fn), file)
        except (TypeError, OSError):
            continue
        if same and first <= int(line) < first + len(src):
            path = "" if path == "model" else _strip(path)  # (the wrapper holds the user's model as .model)
            where = f"{'module ' + repr(path) if path else 'the model'} ({type(m).__name__}.{func}, {file}:{line})"
            break
    return (f"it branches on a tensor's value (data-dependent control flow) in {where}: `{code.strip()}`. "
            "A compiled step is one static graph: compute both branches and pick with torch.where, or "
            "make the condition a Python value fixed at compile time")


def input_names(example_inputs):
    """Keyword names when example_inputs is a dict {forward argument name: tensor}, else None."""
    return tuple(example_inputs) if isinstance(example_inputs, Mapping) else None


def check_example(tensors, what: str) -> tuple:
    """Example inputs/targets as a tuple of torch tensors.  Besides torch tensors, any array
    type (NumPy, JAX, TensorFlow: whatever has __array__, what a Keras, JAX or ONNX user has
    at hand) is taken and converted (float64 arrays become float32, as those frameworks
    compute; int32 arrays, JAX's and TensorFlow's default integers, become int64, PyTorch's
    index type, as class targets and token ids need); a dict {forward argument name: tensor}
    gives keyword inputs, in its order."""
    if isinstance(tensors, Mapping):  # keyword inputs: the step takes them in the dict's order
        if not all(isinstance(k, str) for k in tensors):
            raise PockError(f"{what} given as a dict must map forward() argument names to tensors")
        tensors = tuple(tensors.values())
    if isinstance(tensors, torch.Tensor) or _is_array(tensors):
        tensors = (tensors,)
    if not isinstance(tensors, (tuple, list)):
        raise PockError(f"{what} must be a tuple of torch tensors or arrays (NumPy, JAX, TensorFlow), got "
                        f"{_type_name(tensors)}")
    out = []
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            if not _is_array(t):
                raise PockError(f"{what} must hold torch tensors or arrays (NumPy, JAX, TensorFlow): "
                                f"{what}[{i}] is a {_type_name(t)}")
            t = _from_array(t, f"{what}[{i}]")
        to_ir_dtype(t.dtype, f"{what}[{i}]")
        out.append(t)
    return tuple(out)


def _type_name(x) -> str:
    t = type(x)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__name__}"


def _is_array(x) -> bool:
    return hasattr(x, "__array__") and not isinstance(x, (str, bytes, type))


def _from_array(x, what: str) -> torch.Tensor:
    try:
        a = np.asarray(x)
    except Exception as e:  # an __array__ that fails: name the element
        raise PockError(f"{what} ({type(x).__name__}) could not be read as an array: {e}") from None
    if a.dtype == np.float64:
        a = a.astype(np.float32)
    elif a.dtype == np.int32:  # lossless: PyTorch's index type (the trainer then takes int64, as compiled)
        a = a.astype(np.int64)
    if a.dtype == object or a.dtype.kind not in "biuf":
        raise PockError(f"{what} is a {type(x).__name__} of dtype {a.dtype}; PockEngine takes numeric arrays")
    return torch.from_numpy(np.ascontiguousarray(a).copy())


def export_graph(model: nn.Module, example_inputs, example_targets=None, loss=None, name="model",
                 output=None, names=None, with_outputs: bool = False) -> Graph:
    """Training graph (loss given) or inference graph (loss None) of `model`; `output` picks
    the model output used (see select_output), `names` are keyword names of the inputs.
    with_outputs: the training graph also holds the model's outputs (graph.outputs), what
    passes/inference.inference_graph derives the inference graph from."""
    names = names or input_names(example_inputs)
    inputs = check_example(example_inputs, "example_inputs")
    if loss is not None:
        targets = check_example(example_targets, "example_targets")
        step = _TrainStepAndOutputs if with_outputs else _TrainStep
        module = step(model, resolve_loss(loss), len(inputs), output, names)
        args, what = inputs + targets, "training step"
    else:
        targets = ()
        module, args, what = _Inference(model, output, names), inputs, "model's forward"
    # distinct tensors per argument: torch.export routes every use of one tensor object passed
    # twice (e.g. an autoencoder's (x,), (x,)) to the last placeholder
    args = tuple(t.clone() for t in args)
    ep = _export(module, args, what)
    g = Graph(name)
    ctx = Ctx(g)
    known = _bind_placeholders(ep, g, ctx, len(inputs), tied_aliases(model))
    folded = fold_constants(ep.graph, known, CONVERTERS, force=ctx.unbound)
    for node in ep.graph.nodes:
        if node.op != "call_function":
            continue
        if node.name in folded:
            if any(u.op == "output" or u.name not in folded for u in node.users):
                ctx.env[node.name] = _bind_folded(g, node, folded[node.name])
            continue
        for a in node.all_input_nodes:
            if a.name in ctx.unbound:
                to_ir_dtype(known[a.name].dtype, ctx.unbound[a.name])  # raises, naming the tensor
        ctx.convert(node)
    _bind_outputs(ep, g, ctx, training=loss is not None, with_outputs=with_outputs)
    return verify(g, "frontend")


def _strip(name: str) -> str:
    return name[len("model."):] if name.startswith("model.") else name


def _bind_folded(g: Graph, node, value):
    """A compile-time-evaluated value as a constant of the step (tensors) or as itself."""
    if isinstance(value, (tuple, list)):
        return type(value)(_bind_folded(g, node, v) for v in value)
    if not isinstance(value, torch.Tensor):
        return value
    if value.dtype == torch.float64:
        value = value.float()
    name = f"const:{module_path(node).split(' ')[0] or 'model'}.{node.name}"
    dtype = to_ir_dtype(value.dtype, f"constant {node.name} ({module_path(node)})")
    data = value.detach().contiguous().cpu().numpy().astype(NUMPY[dtype]).copy()
    return g.add_state(name, value.shape, dtype, "const", data=data)


def _bind_placeholders(ep, g: Graph, ctx: Ctx, n_inputs: int, aliases: dict[str, str]) -> dict:
    """Binds every placeholder; returns {placeholder name: tensor} for those whose contents
    are fixed (constants, non-persistent buffers): the seeds of compile-time evaluation."""
    known = {}
    sig = ep.graph_signature
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    user_index = 0
    for spec in sig.input_specs:
        fx = placeholders[spec.arg.name]
        if spec.kind == InputKind.USER_INPUT:
            val = fx.meta["val"]
            kind = "input" if user_index < n_inputs else "target"
            label = f"input{user_index}" if kind == "input" else f"target{user_index - n_inputs}"
            ctx.env[fx.name] = g.add_input(label, val.shape, to_ir_dtype(val.dtype, label), kind)
            user_index += 1
            continue
        if spec.kind == InputKind.PARAMETER:
            kind, tensor = "param", ep.state_dict[spec.target]
        elif spec.kind == InputKind.BUFFER:
            kind = "buffer"
            tensor = ep.state_dict[spec.target] if spec.target in ep.state_dict else ep.constants[spec.target]
        elif spec.kind == InputKind.CONSTANT_TENSOR:
            kind, tensor = "const", ep.constants[spec.target]
        else:
            raise PockError(f"unsupported exported input {spec.arg.name} of kind {spec.kind.name}")
        if kind == "const" or (kind == "buffer" and not spec.persistent):
            known[fx.name] = tensor.detach()
        name = aliases.get(_strip(spec.target), _strip(spec.target))  # tied weights: one canonical name
        if name in g.state:
            ctx.env[fx.name] = g.state[name]
            continue
        if kind == "const" or (kind == "buffer" and not spec.persistent):
            name = f"{kind}:{name}"
            kind = "const" if kind == "const" else "buffer"
        t = tensor.detach()
        if fx.name in known and t.dtype not in _DTYPES:  # e.g. RecurrentGemma's bf16 normalizer:
            ctx.unbound[fx.name] = name  # fine while only compile-time evaluation reads it
            continue
        dtype = to_ir_dtype(t.dtype, name)
        data = t.contiguous().cpu().numpy().copy()
        ctx.env[fx.name] = g.add_state(name, t.shape, dtype, kind, data=data.astype(NUMPY[dtype], copy=False))
    return known


def _bind_outputs(ep, g: Graph, ctx: Ctx, training: bool, with_outputs: bool = False):
    out_node = next(n for n in ep.graph.nodes if n.op == "output")
    results = out_node.args[0]
    user = []
    for spec, arg in zip(ep.graph_signature.output_specs, results):
        if spec.kind == OutputKind.BUFFER_MUTATION:
            dst = g.state[_strip(spec.target)]
            src = ctx.value(arg)
            g.add("assign", [dst, src], source=dst.name.rsplit(".", 1)[0])
        elif spec.kind == OutputKind.USER_OUTPUT:
            user.append(ctx.get(arg))
        else:
            raise PockError(f"unsupported exported output of kind {spec.kind.name} ({spec.target})")
    flat = []
    for u in user:
        flat.extend(u if isinstance(u, (tuple, list)) else [u])
    if training:
        # exported with the model's outputs (with_outputs): the loss is the first of (loss, outputs)
        n = ep.call_spec.out_spec.child(0).num_leaves if with_outputs else len(flat)
        loss, flat = flat[:n], flat[n:]
        if len(loss) != 1 or not isinstance(loss[0], Value) or loss[0].shape != () or loss[0].dtype != "f32":
            raise PockError("the loss must return a single float32 scalar tensor")
        g.loss = loss[0]
    if with_outputs or not training:
        for v in flat:
            if not isinstance(v, Value):
                raise PockError(f"model outputs must be tensors, got {type(v).__name__}")
        g.outputs = flat


def tied_aliases(model: nn.Module) -> dict[str, str]:
    """state_dict names that share a tensor with an earlier name: alias -> canonical."""
    seen: dict[int, str] = {}
    aliases = {}
    for name, t in model.state_dict(keep_vars=True).items():
        key = id(t)
        if key in seen:
            aliases[name] = seen[key]
        else:
            seen[key] = name
    return aliases


__all__ = ["export_graph", "resolve_loss", "tied_aliases", "check_example", "input_names", "select_output"]
