"""ONNX frontend: an ONNX graph → a torch module that runs it → the torch path.

    prog = pe.compile("model.onnx", example_inputs=(x,), example_targets=(y,), ...)
    pe.export_onnx(trainer, "model.onnx", "personalized.onnx")   # new weights, same graph

`OnnxModule` interprets the ONNX nodes with torch ops (one small function per
ONNX op in `OPS`), holding the float initializers as parameters under their
ONNX names (BatchNormalization's running statistics as buffers). So
torch.export traces it into ATen ops and the rest of PockEngine (autodiff,
sparse updates, reordering, backends, SDKs) is unchanged. Everything that
depends only on constants and static shapes (Shape, shape arithmetic,
Reshape targets) is folded once when the module is built, so the traced graph
holds only tensor maths. An op not in `OPS` is a PockError naming the node.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import PockError
from .named import set_named_tensor


def load_onnx(model):
    """A path to a .onnx file or an onnx.ModelProto → onnx.ModelProto."""
    import onnx
    if isinstance(model, onnx.ModelProto):
        return model
    try:
        return onnx.load(str(model))
    except Exception as e:
        raise PockError(f"could not read ONNX model {str(model)!r}: {type(e).__name__}: {e}") from e


def _attrs(node) -> dict:
    import onnx
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _np(t) -> np.ndarray:
    import onnx.numpy_helper
    return onnx.numpy_helper.to_array(t)


# BatchNormalization inputs 3 and 4 are running statistics: buffers, not parameters
_BUFFER_INPUTS = {"BatchNormalization": (3, 4)}


class OnnxModule(nn.Module):
    """Runs an ONNX graph with torch ops; initializers are parameters named as in the file."""

    def __init__(self, model):
        super().__init__()
        model = load_onnx(model)
        graph = model.graph
        self._onnx_name = graph.name or "onnx_model"
        inits = {t.name: _np(t) for t in graph.initializer}
        buffers = {n.input[i] for n in graph.node for i in _BUFFER_INPUTS.get(n.op_type, ()) if i < len(n.input)}
        self._static: dict[str, np.ndarray] = {}  # values known at compile time (folded)
        self._tensor_names: list[str] = []        # initializers held as parameters/buffers
        self._buffer_names = buffers
        for name, arr in inits.items():
            if arr.dtype.kind == "f" and arr.size > 1 or name in buffers:
                if arr.dtype != np.float32:
                    raise PockError(f"ONNX initializer {name!r} is {arr.dtype}; PockEngine trains float32 models")
                set_named_tensor(self, name, torch.from_numpy(arr.copy()), parameter=name not in buffers)
                self._tensor_names.append(name)
            else:
                self._static[name] = arr
        self._inputs = [i.name for i in graph.input if i.name not in inits]
        self._outputs = [o.name for o in graph.output]
        self._nodes = [(n.op_type, list(n.input), list(n.output), _attrs(n), n.name or n.output[0]) for n in graph.node]
        for op, _, _, _, label in self._nodes:
            if op not in OPS:
                raise PockError(f"ONNX node {label!r}: op {op!r} is not supported by PockEngine's ONNX frontend "
                                f"(supported: {', '.join(sorted(OPS))})")
        self._shapes = _static_shapes(model)
        self._fold()
        # as tensors made once, outside tracing: torch.export lifts them as constants
        self._consts = {k: torch.from_numpy(np.array(v)) for k, v in self._static.items()}

    def _fold(self):
        """Evaluate every node whose inputs are all static (constants, shapes) once, now."""
        for op, ins, outs, attrs, label in self._nodes:
            if op == "Shape" and ins[0] in self._shapes:
                shape = np.array(self._shapes[ins[0]], np.int64)
                self._static[outs[0]] = shape[attrs.get("start", 0):attrs.get("end", len(shape))]
                continue
            if not all(i == "" or i in self._static for i in ins) or op in _NEVER_FOLD:
                continue
            args = [None if i == "" else torch.from_numpy(np.array(self._static[i])) for i in ins]
            results = _run(self, op, args, attrs, label)
            for name, r in zip(outs, results):
                self._static[name] = r.numpy() if isinstance(r, torch.Tensor) else np.asarray(r)

    def forward(self, *args):
        if len(args) != len(self._inputs):
            raise PockError(f"the ONNX model takes {len(self._inputs)} inputs ({', '.join(self._inputs)}), got {len(args)}")
        env: dict[str, torch.Tensor] = dict(zip(self._inputs, args))
        for name in self._tensor_names:
            env[name] = self.get_buffer(name) if name in self._buffer_names else self.get_parameter(name)
        for op, ins, outs, attrs, label in self._nodes:
            if all(o in self._static for o in outs):
                continue
            vals = [None if i == "" else env[i] if i in env else self._consts[i] for i in ins]
            for name, r in zip(outs, _run(self, op, vals, attrs, label)):
                env[name] = r
        res = [env[o] if o in env else self._consts[o] for o in self._outputs]
        return res[0] if len(res) == 1 else tuple(res)


def _static_shapes(model) -> dict[str, tuple]:
    import onnx
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:
        inferred = model
    g = inferred.graph
    out = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        dims = vi.type.tensor_type.shape.dim
        if vi.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
            out[vi.name] = tuple(d.dim_value for d in dims)
    return out


def _run(module, op, args, attrs, label):
    try:
        r = OPS[op](module, args, attrs)
    except PockError:
        raise
    except Exception as e:
        raise PockError(f"ONNX node {label!r} (op {op}) failed: {type(e).__name__}: {e}") from e
    return r if isinstance(r, (tuple, list)) else (r,)


# -- ops: f(module, inputs, attrs) -> output or tuple of outputs ------------------------------
OPS = {}
_NEVER_FOLD = {"BatchNormalization", "Dropout"}


def op(*names):
    def register(fn):
        for n in names:
            OPS[n] = fn
        return fn
    return register


def _ints(t) -> list[int]:
    return [int(v) for v in (t.tolist() if isinstance(t, torch.Tensor) else np.asarray(t).tolist())]


for _name, _fn in [("Relu", torch.relu), ("Sigmoid", torch.sigmoid), ("Tanh", torch.tanh), ("Exp", torch.exp),
                   ("Log", torch.log), ("Sqrt", torch.sqrt), ("Neg", torch.neg), ("Abs", torch.abs),
                   ("Reciprocal", torch.reciprocal), ("Erf", torch.erf), ("Not", torch.logical_not)]:
    OPS[_name] = (lambda fn: lambda m, a, at: fn(a[0]))(_fn)
for _name, _fn in [("Add", torch.add), ("Sub", torch.sub), ("Mul", torch.mul), ("Div", torch.div),
                   ("Pow", torch.pow), ("Equal", torch.eq), ("Less", torch.lt), ("Greater", torch.gt),
                   ("And", torch.logical_and), ("Or", torch.logical_or), ("MatMul", torch.matmul)]:
    OPS[_name] = (lambda fn: lambda m, a, at: fn(a[0], a[1]))(_fn)


@op("Div")
def _div(m, a, at):
    if not a[0].is_floating_point() and not a[1].is_floating_point():
        return torch.div(a[0], a[1], rounding_mode="trunc")
    return a[0] / a[1]


@op("Identity")
def _identity(m, a, at):
    return a[0]


@op("Dropout")
def _dropout(m, a, at):
    ratio = float(a[1]) if len(a) > 1 and a[1] is not None else at.get("ratio", 0.5)
    train = bool(a[2]) if len(a) > 2 and a[2] is not None else False
    return F.dropout(a[0], ratio, training=train and m.training)


@op("Constant")
def _constant(m, a, at):
    if "value" in at:
        return torch.from_numpy(_np(at["value"]).copy())
    for k in ("value_float", "value_int"):
        if k in at:
            return torch.tensor(at[k])
    for k in ("value_floats", "value_ints"):
        if k in at:
            return torch.tensor(list(at[k]))
    raise PockError(f"ONNX Constant with attributes {sorted(at)} is not supported")


@op("Cast")
def _cast(m, a, at):
    import onnx
    dtype = {onnx.TensorProto.FLOAT: torch.float32, onnx.TensorProto.INT64: torch.int64,
             onnx.TensorProto.INT32: torch.int32, onnx.TensorProto.BOOL: torch.bool}.get(at["to"])
    if dtype is None:
        raise PockError(f"ONNX Cast to type {at['to']} is not supported")
    return a[0].to(dtype)


@op("Gemm")
def _gemm(m, a, at):
    x = a[0].t() if at.get("transA", 0) else a[0]
    w = a[1] if at.get("transB", 0) else a[1].t()
    y = F.linear(x, w) * at.get("alpha", 1.0) if at.get("alpha", 1.0) != 1.0 else F.linear(x, w)
    if len(a) > 2 and a[2] is not None:
        y = y + (a[2] * at["beta"] if at.get("beta", 1.0) != 1.0 else a[2])
    return y


def _pads(at, nd=2):
    if at.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID", b"NOTSET", b"VALID"):
        raise PockError(f"ONNX auto_pad={at['auto_pad']} is not supported; export with explicit pads")
    pads = list(at.get("pads", [0] * 2 * nd))
    if pads[:nd] != pads[nd:]:
        raise PockError(f"ONNX asymmetric pads {pads} are not supported")
    return pads[:nd]


@op("Conv")
def _conv(m, a, at):
    if a[0].dim() != 4:
        raise PockError(f"ONNX Conv on a {a[0].dim()}-d input is not supported (only 2-d convolution)")
    return F.conv2d(a[0], a[1], a[2] if len(a) > 2 else None, stride=list(at.get("strides", [1, 1])),
                    padding=_pads(at), dilation=list(at.get("dilations", [1, 1])), groups=at.get("group", 1))


@op("BatchNormalization")
def _batch_norm(m, a, at):
    x, w, b, mean, var = a[:5]
    train = bool(at.get("training_mode", 0)) and m.training
    # ONNX momentum weighs the old statistic (0.9); torch's weighs the new one (0.1)
    y = F.batch_norm(x, mean, var, w, b, training=train, momentum=1.0 - at.get("momentum", 0.9),
                     eps=at.get("epsilon", 1e-5))
    return (y, mean, var) if train else y


@op("MaxPool")
def _max_pool(m, a, at):
    return F.max_pool2d(a[0], list(at["kernel_shape"]), list(at.get("strides", at["kernel_shape"])), _pads(at),
                        list(at.get("dilations", [1, 1])), ceil_mode=bool(at.get("ceil_mode", 0)))


@op("AveragePool")
def _avg_pool(m, a, at):
    return F.avg_pool2d(a[0], list(at["kernel_shape"]), list(at.get("strides", at["kernel_shape"])), _pads(at),
                        ceil_mode=bool(at.get("ceil_mode", 0)), count_include_pad=bool(at.get("count_include_pad", 0)))


@op("GlobalAveragePool")
def _global_avg(m, a, at):
    return a[0].mean(dim=list(range(2, a[0].dim())), keepdim=True)


@op("Flatten")
def _flatten(m, a, at):
    axis = at.get("axis", 1) % max(a[0].dim(), 1)
    return a[0].reshape(int(np.prod(a[0].shape[:axis])), -1)


@op("Reshape")
def _reshape(m, a, at):
    shape = _ints(a[1])
    if not at.get("allowzero", 0):
        shape = [a[0].shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return a[0].reshape(shape)


@op("Transpose")
def _transpose(m, a, at):
    return a[0].permute(list(at.get("perm", reversed(range(a[0].dim())))))


@op("Softmax")
def _softmax(m, a, at):
    return F.softmax(a[0], at.get("axis", -1))


@op("LogSoftmax")
def _log_softmax(m, a, at):
    return F.log_softmax(a[0], at.get("axis", -1))


@op("LayerNormalization")
def _layer_norm(m, a, at):
    axis = at.get("axis", -1) % a[0].dim()
    return F.layer_norm(a[0], a[0].shape[axis:], a[1], a[2] if len(a) > 2 else None, at.get("epsilon", 1e-5))


def _axes(a, at):
    if len(a) > 1 and a[1] is not None:
        return _ints(a[1])
    return list(at.get("axes", []))


@op("ReduceMean")
def _reduce_mean(m, a, at):
    axes = _axes(a, at) or list(range(a[0].dim()))
    return a[0].mean(dim=axes, keepdim=bool(at.get("keepdims", 1)))


@op("ReduceSum")
def _reduce_sum(m, a, at):
    axes = _axes(a, at) or list(range(a[0].dim()))
    return a[0].sum(dim=axes, keepdim=bool(at.get("keepdims", 1)))


@op("Unsqueeze")
def _unsqueeze(m, a, at):
    x = a[0]
    axes = sorted(ax % (x.dim() + len(_axes(a, at))) for ax in _axes(a, at))
    for ax in axes:
        x = x.unsqueeze(ax)
    return x


@op("Squeeze")
def _squeeze(m, a, at):
    axes = _axes(a, at)
    return a[0].squeeze(axes) if axes else a[0].squeeze()


@op("Concat")
def _concat(m, a, at):
    return torch.cat([t for t in a if t is not None], at["axis"])


@op("Gather")
def _gather(m, a, at):
    data, idx = a
    axis = at.get("axis", 0) % data.dim()
    if idx.dim() == 0:
        return data.select(axis, int(idx) % data.shape[axis])
    if axis == 0 and data.is_floating_point():
        return F.embedding(idx, data)
    return data.index_select(axis, idx.reshape(-1)).reshape(*data.shape[:axis], *idx.shape, *data.shape[axis + 1:])


@op("Slice")
def _slice(m, a, at):
    x = a[0]
    starts, ends = _ints(a[1]), _ints(a[2])
    axes = _ints(a[3]) if len(a) > 3 and a[3] is not None else list(range(len(starts)))
    steps = _ints(a[4]) if len(a) > 4 and a[4] is not None else [1] * len(starts)
    index = [slice(None)] * x.dim()
    for s, e, ax, st in zip(starts, ends, axes, steps):
        if st != 1:
            raise PockError(f"ONNX Slice with step {st} is not supported")
        n = x.shape[ax]
        index[ax % x.dim()] = slice(max(min(s, n), -n), max(min(e, n), -n - 1))
    return x[tuple(index)]


@op("Split")
def _split(m, a, at):
    axis = at.get("axis", 0)
    sizes = _ints(a[1]) if len(a) > 1 and a[1] is not None else list(at.get("split", []))
    if not sizes:
        n = at.get("num_outputs")
        sizes = [a[0].shape[axis] // n] * n
    return tuple(torch.split(a[0], sizes, axis))


@op("Expand")
def _expand(m, a, at):
    shape = _ints(a[1])
    return a[0] * torch.ones(shape, dtype=a[0].dtype) if len(shape) > a[0].dim() else a[0].expand(
        [max(s, d) if s != 1 else d for s, d in zip(shape, a[0].shape)])


@op("Where")
def _where(m, a, at):
    return torch.where(a[0], a[1], a[2])


@op("ConstantOfShape")
def _constant_of_shape(m, a, at):
    value = _np(at["value"]) if "value" in at else np.zeros(1, np.float32)
    return torch.full(_ints(a[0]), value.reshape(-1)[0].item(), dtype=torch.from_numpy(value).dtype)


@op("Range")
def _range(m, a, at):
    return torch.arange(a[0].item(), a[1].item(), a[2].item())


@op("Shape")
def _shape(m, a, at):
    return torch.tensor(list(a[0].shape)[at.get("start", 0):at.get("end", a[0].dim())], dtype=torch.int64)


@op("Clip")
def _clip(m, a, at):
    lo = a[1] if len(a) > 1 and a[1] is not None else None
    hi = a[2] if len(a) > 2 and a[2] is not None else None
    if lo is not None and hi is not None and float(lo) == 0.0 and float(hi) == 6.0:
        return F.relu6(a[0])
    return torch.clamp(a[0], None if lo is None else float(lo), None if hi is None else float(hi))


@op("Trilu")
def _trilu(m, a, at):
    k = int(a[1]) if len(a) > 1 and a[1] is not None else 0
    return torch.triu(a[0], k) if at.get("upper", 1) else torch.tril(a[0], k)


def _rnn_direction(at, label: str) -> list[bool]:
    """[reverse?] per direction of an ONNX LSTM/GRU node."""
    d = at.get("direction", b"forward")
    d = d.decode() if isinstance(d, bytes) else d
    if d not in ("forward", "reverse", "bidirectional"):
        raise PockError(f"{label}: direction {d!r} is not supported")
    return {"forward": [False], "reverse": [True], "bidirectional": [False, True]}[d]


def _rnn_checks(at, op, defaults):
    acts = [x.decode() if isinstance(x, bytes) else x for x in at.get("activations", [])]
    if acts and [a.lower() for a in acts] != [a.lower() for a in defaults * (len(acts) // len(defaults))]:
        raise PockError(f"ONNX {op}: activations {acts} are not supported (the defaults are)")
    if at.get("clip") is not None or at.get("input_forget", 0):
        raise PockError(f"ONNX {op}: clip and input_forget are not supported")
    if at.get("layout", 0) != 0:
        raise PockError(f"ONNX {op}: layout=1 (batch first) is not supported; export with layout 0")


def _run_directions(a, at, hidden, cell, op):
    """Y (T, D, B, H), Y_h (D, B, H) [, Y_c] of an unrolled ONNX recurrent node; `cell(x_t, state, d)`
    returns the new state tuple (h first)."""
    x = a[0]
    if len(a) > 4 and a[4] is not None:
        raise PockError(f"ONNX {op}: sequence_lens is not supported (pad to one length)")
    outs, finals = [], []
    for d, reverse in enumerate(_rnn_direction(at, f"ONNX {op}")):
        state = []
        for k in range(5, 5 + (2 if op == "LSTM" else 1)):
            init = a[k] if len(a) > k and a[k] is not None else None
            state.append(init[d] if init is not None else x.new_zeros(x.shape[1], hidden))
        state = tuple(state)
        steps = range(x.shape[0] - 1, -1, -1) if reverse else range(x.shape[0])
        ys = [None] * x.shape[0]
        for t in steps:
            state = cell(x[t], state, d)
            ys[t] = state[0]
        outs.append(torch.stack(ys, 0))
        finals.append(state)
    y = torch.stack(outs, 1)
    res = [y, torch.stack([f[0] for f in finals], 0)]
    if op == "LSTM":
        res.append(torch.stack([f[1] for f in finals], 0))
    return tuple(res)


@op("LSTM")
def _lstm(m, a, at):
    """ONNX LSTM (gates i, o, f, c; B = [Wb, Rb]), unrolled over the sequence."""
    _rnn_checks(at, "LSTM", ["Sigmoid", "Tanh", "Tanh"])
    if len(a) > 7 and a[7] is not None:
        raise PockError("ONNX LSTM: peephole weights (input P) are not supported")
    w, r = a[1], a[2]
    b = a[3] if len(a) > 3 and a[3] is not None else None
    hidden = r.shape[-1]

    def cell(xt, state, d):
        h, c = state
        z = torch.matmul(xt, w[d].t()) + torch.matmul(h, r[d].t())
        if b is not None:
            z = z + b[d, :4 * hidden] + b[d, 4 * hidden:]
        i, o, f, g = (z[:, j * hidden:(j + 1) * hidden] for j in range(4))
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c

    return _run_directions(a, at, hidden, cell, "LSTM")


@op("GRU")
def _gru(m, a, at):
    """ONNX GRU (gates z, r, h; B = [Wb, Rb]; linear_before_reset 0 or 1), unrolled."""
    _rnn_checks(at, "GRU", ["Sigmoid", "Tanh"])
    w, r = a[1], a[2]
    b = a[3] if len(a) > 3 and a[3] is not None else None
    hidden = r.shape[-1]
    before = at.get("linear_before_reset", 0)

    def cell(xt, state, d):
        (h,) = state
        xw = torch.matmul(xt, w[d].t())
        if b is not None:
            xw = xw + b[d, :3 * hidden]
        rb = b[d, 3 * hidden:] if b is not None else None
        xz, xr, xh = (xw[:, j * hidden:(j + 1) * hidden] for j in range(3))
        rz, rr, rh = (r[d, j * hidden:(j + 1) * hidden] for j in range(3))
        bz, br, bh = (rb[j * hidden:(j + 1) * hidden] for j in range(3)) if rb is not None else (0.0, 0.0, 0.0)
        z = torch.sigmoid(xz + torch.matmul(h, rz.t()) + bz)
        rg = torch.sigmoid(xr + torch.matmul(h, rr.t()) + br)
        if before:
            cand = torch.tanh(xh + rg * (torch.matmul(h, rh.t()) + bh))
        else:
            cand = torch.tanh(xh + torch.matmul(rg * h, rh.t()) + bh)
        return ((1.0 - z) * cand + z * h,)

    return _run_directions(a, at, hidden, cell, "GRU")


@op("Gelu")
def _gelu(m, a, at):
    return F.gelu(a[0], approximate=at.get("approximate", "none"))


# -- export back ----------------------------------------------------------------------------------
def export_onnx(trainer, src, dst, inference: bool = True) -> Path:
    """Write `src`'s ONNX model to `dst` with the trainer's current weights (initializers by name).

    inference=True (default) also switches BatchNormalization nodes exported in training mode to
    inference (running statistics, one output), so the file is what an app runs to predict."""
    import onnx
    import onnx.numpy_helper
    model = load_onnx(src)
    model = onnx.ModelProto.FromString(model.SerializeToString())  # never modify the caller's proto
    state = trainer.state_dict()
    written = 0
    for t in model.graph.initializer:
        if t.name in state:
            arr = np.asarray(state[t.name], dtype=np.float32).reshape(tuple(t.dims))
            t.CopyFrom(onnx.numpy_helper.from_array(arr, t.name))
            written += 1
    if not written:
        raise PockError(f"no initializer of {str(src)!r} is a tensor of this trainer; export to the ONNX file "
                        "the program was compiled from")
    if inference:
        for node in model.graph.node:
            if node.op_type == "BatchNormalization":
                for a in node.attribute:
                    if a.name == "training_mode":
                        a.i = 0
                del node.output[1:]
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(dst))
    return dst
