"""TFLite frontend: a float32 `.tflite` flatbuffer → a torch module that runs it → the torch path.

    prog = pe.compile("model.tflite", example_inputs=(x,), example_targets=(y,), ...)
    pe.export_tflite(trainer, "model.tflite", "personalized.tflite")   # new weights, same graph

The flatbuffer is read with the TFLite schema package (PyPI `tflite`, generated from
TensorFlow's schema.fbs; pure Python, so compiling a .tflite never imports TensorFlow).
`TFLiteModule` interprets the main subgraph's operators with torch ops (one small function per
builtin operator in `OPS`). Float32 constant tensors with more than one element (weights,
biases, norm scales) become parameters under their TFLite tensor names; integer constants
(shapes, axes) and float scalars stay constants.

Layouts: activations stay NHWC as in the file (convolutions and pools permute to NCHW around
the torch op); weights are held in torch's layout (CONV_2D OHWI → OIHW, DEPTHWISE_CONV_2D
1HW(C·m) → (C·m)1HW) so a sparse `update` ratio means "the first k input channels" as for a
torch model; `export_tflite` writes them back in the file's layout, in place (the flatbuffer's
structure is unchanged, so every interpreter and delegate reads it as before).

The batch dimension: converters write batch 1 into the graph (input shape and RESHAPE
targets); the module takes the example inputs' batch instead.

Converters fold BatchNormalization into the preceding convolution and drop all-zero biases
(or share one zero tensor between layers): what trains is what the file holds.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import PockError
from .named import set_named_tensor

# TFLite TensorType -> numpy
_DTYPES = {0: np.float32, 1: np.float16, 2: np.int32, 3: np.uint8, 4: np.int64, 6: np.bool_, 7: np.int16,
           9: np.int8, 10: np.float64}
_FUSED = {0: None, 1: F.relu, 2: lambda x: x.clamp(-1.0, 1.0), 3: F.relu6, 4: torch.tanh}


def _schema():
    try:
        import tflite
    except ImportError as e:  # pragma: no cover - a dev dependency
        raise PockError("reading .tflite files needs the `tflite` package (pip install tflite==2.18.0)") from e
    return tflite


def _read(model) -> bytes:
    if isinstance(model, (bytes, bytearray)):
        return bytes(model)
    try:
        return Path(model).read_bytes()
    except OSError as e:
        raise PockError(f"could not read TFLite model {str(model)!r}: {e}") from e


def _op_names() -> dict[int, str]:
    tfl = _schema()
    return {v: k for k, v in vars(tfl.BuiltinOperator).items() if not k.startswith("_") and isinstance(v, int)}


class _File:
    """The parts of a flatbuffer the module needs: tensors, constant data, operators."""

    def __init__(self, buf: bytes):
        tfl = _schema()
        self.buf = buf
        try:
            if len(buf) < 8 or buf[4:8] != b"TFL3":
                raise ValueError("no TFL3 file identifier")
            self.model = tfl.Model.GetRootAsModel(buf, 0)
            if self.model.SubgraphsLength() < 1:
                raise ValueError("no subgraph")
            g = self.model.Subgraphs(0)
        except Exception as e:
            raise PockError(f"not a TFLite flatbuffer ({type(e).__name__}: {e})") from e
        self.graph = g
        names = _op_names()
        self.tensors = []
        for i in range(g.TensorsLength()):
            t = g.Tensors(i)
            shape = tuple(int(s) for s in t.ShapeAsNumpy()) if t.ShapeLength() else ()
            self.tensors.append((t.Name().decode(errors="replace"), shape, t.Type(), t.Buffer()))
        self.inputs = [int(i) for i in g.InputsAsNumpy()]
        self.outputs = [int(i) for i in g.OutputsAsNumpy()]
        self.ops = []
        for i in range(g.OperatorsLength()):
            op = g.Operators(i)
            oc = self.model.OperatorCodes(op.OpcodeIndex())
            code = max(oc.BuiltinCode(), oc.DeprecatedBuiltinCode())
            name = names.get(code, f"builtin {code}")
            if code == getattr(tfl.BuiltinOperator, "CUSTOM", 32):
                name = f"CUSTOM ({(oc.CustomCode() or b'?').decode(errors='replace')})"
            ins = [int(x) for x in op.InputsAsNumpy()] if op.InputsLength() else []
            outs = [int(x) for x in op.OutputsAsNumpy()] if op.OutputsLength() else []
            self.ops.append((name, ins, outs, self._options(op, name), i))

    def data_span(self, tensor: int) -> tuple[int, int] | None:
        """(byte offset in the file, byte length) of a constant tensor's data, or None."""
        buffer = self.model.Buffers(self.tensors[tensor][3])
        if buffer is None:
            return None
        if buffer.Offset() > 1:  # large models: data after the flatbuffer
            return int(buffer.Offset()), int(buffer.Size())
        if buffer.DataLength() == 0:
            return None
        import flatbuffers
        o = flatbuffers.number_types.UOffsetTFlags.py_type(buffer._tab.Offset(4))
        return int(buffer._tab.Vector(o)), int(buffer.DataLength())

    def constant(self, tensor: int) -> np.ndarray | None:
        span = self.data_span(tensor)
        if span is None:
            return None
        name, shape, ttype, _ = self.tensors[tensor]
        if ttype not in _DTYPES:
            raise PockError(f"TFLite tensor {name!r} has type {ttype}, which PockEngine does not read "
                            "(quantized models are not supported: convert to float32)")
        start, length = span
        arr = np.frombuffer(self.buf, dtype=_DTYPES[ttype], count=length // np.dtype(_DTYPES[ttype]).itemsize,
                            offset=start)
        return arr.reshape(shape).copy()

    @staticmethod
    def _options(op, name: str) -> dict:
        """The builtin options the interpreters below read, as a plain dict."""
        tfl = _schema()
        table = op.BuiltinOptions()
        if table is None:
            return {}
        cls = {"CONV_2D": "Conv2DOptions", "DEPTHWISE_CONV_2D": "DepthwiseConv2DOptions",
               "FULLY_CONNECTED": "FullyConnectedOptions", "ADD": "AddOptions", "SUB": "SubOptions",
               "MUL": "MulOptions", "DIV": "DivOptions", "SOFTMAX": "SoftmaxOptions",
               "CONCATENATION": "ConcatenationOptions", "MAX_POOL_2D": "Pool2DOptions",
               "AVERAGE_POOL_2D": "Pool2DOptions", "MEAN": "ReducerOptions", "SUM": "ReducerOptions",
               "REDUCE_MAX": "ReducerOptions", "RESHAPE": "ReshapeOptions", "BATCH_MATMUL": "BatchMatMulOptions",
               "SQUEEZE": "SqueezeOptions", "GELU": "GeluOptions", "GATHER": "GatherOptions",
               "LEAKY_RELU": "LeakyReluOptions", "STRIDED_SLICE": "StridedSliceOptions"}.get(name)
        if cls is None or not hasattr(tfl, cls):
            return {}
        o = getattr(tfl, cls)()
        o.Init(table.Bytes, table.Pos)
        out = {}
        for attr in ("Padding", "StrideW", "StrideH", "DilationWFactor", "DilationHFactor", "DepthMultiplier",
                     "FusedActivationFunction", "KeepNumDims", "Beta", "Axis", "FilterWidth", "FilterHeight",
                     "KeepDims", "AdjX", "AdjY", "Approximate", "BatchDims", "Alpha", "BeginMask", "EndMask",
                     "ShrinkAxisMask", "EllipsisMask", "NewAxisMask", "Offset"):
            if hasattr(o, attr):
                out[attr] = getattr(o, attr)()
        if hasattr(o, "NewShapeAsNumpy") and o.NewShapeLength():
            out["NewShape"] = [int(s) for s in o.NewShapeAsNumpy()]
        if hasattr(o, "SqueezeDimsAsNumpy") and o.SqueezeDimsLength():
            out["SqueezeDims"] = [int(s) for s in o.SqueezeDimsAsNumpy()]
        return out


# inputs of these operators that are weights in a non-torch layout: (op, input index) -> permutation
_TO_TORCH = {("CONV_2D", 1): (0, 3, 1, 2), ("DEPTHWISE_CONV_2D", 1): (3, 0, 1, 2)}


def _inverse(perm):
    return tuple(int(i) for i in np.argsort(perm))


class TFLiteModule(nn.Module):
    """Runs a .tflite model's main subgraph with torch ops; float tensors are parameters named
    as in the file (in torch layout, see the module docstring)."""

    def __init__(self, model):
        super().__init__()
        f = _File(_read(model))
        self._tensors = f.tensors
        self._inputs, self._outputs = f.inputs, f.outputs
        self._ops = f.ops
        for name, _, _, _, i in self._ops:
            if name not in OPS and name not in _FOLD:
                raise PockError(f"TFLite operator {i} ({name}, output {self._out_name(i)!r}) is not supported by "
                                f"PockEngine's TFLite frontend (supported: {', '.join(sorted(set(OPS) | set(_FOLD)))})")
        layout = {}
        for name, ins, _, _, _ in self._ops:
            for k, t in enumerate(ins):
                if (name, k) in _TO_TORCH and t >= 0:
                    layout[t] = _TO_TORCH[(name, k)]
        self._layout = layout  # tensor -> permutation from the file's layout to torch's
        self._param_of: dict[int, str] = {}
        self._static: dict[int, np.ndarray] = {}
        used = set()
        for t, (name, shape, ttype, _) in enumerate(self._tensors):
            if t in self._inputs:
                continue
            arr = f.constant(t)
            if arr is None:
                continue
            if arr.dtype == np.float32 and arr.size > 1:
                pname = name.replace(".", "_") or f"tensor_{t}"
                while pname in used:
                    pname += "_"
                used.add(pname)
                if t in layout:
                    arr = np.ascontiguousarray(arr.transpose(layout[t]))
                set_named_tensor(self, pname, torch.from_numpy(arr))
                self._param_of[t] = pname
            else:
                self._static[t] = arr
        self._consts = {t: torch.from_numpy(np.array(v)) for t, v in self._static.items()}
        self._file_batch = self._tensors[self._inputs[0]][1][0] if self._tensors[self._inputs[0]][1] else None

    def _out_name(self, op_index: int) -> str:
        outs = self._ops[op_index][2]
        return self._tensors[outs[0]][0] if outs else "?"

    def tflite_layout(self) -> dict[str, tuple]:
        """{parameter name: permutation from torch's layout back to the file's} for the permuted ones."""
        return {self._param_of[t]: _inverse(p) for t, p in self._layout.items() if t in self._param_of}

    def tflite_tensor(self) -> dict[str, int]:
        """{parameter name: tensor index in the file}."""
        return {n: t for t, n in self._param_of.items()}

    def forward(self, *args):
        if len(args) != len(self._inputs):
            raise PockError(f"the TFLite model takes {len(self._inputs)} inputs, got {len(args)}")
        env: dict[int, torch.Tensor] = dict(zip(self._inputs, args))
        for t, pname in self._param_of.items():
            env[t] = self.get_parameter(pname)
        batch = args[0].shape[0] if args and args[0].dim() else None
        static = dict(self._static)  # + shape bookkeeping computed from the (static) input shapes
        for name, ins, outs, opts, i in self._ops:
            if name in _FOLD and (name == "SHAPE" or all(t < 0 or t in static for t in ins)):
                shapes = [tuple(env[t].shape) if t in env else None for t in ins]
                try:
                    r = _FOLD[name]([None if t < 0 else static.get(t) for t in ins], shapes, opts)
                except PockError:
                    raise
                except Exception as e:
                    raise PockError(f"TFLite operator {i} ({name}, output {self._out_name(i)!r}) failed on "
                                    f"constants: {type(e).__name__}: {e}") from e
                static[outs[0]] = r
                continue
            vals = [None if t < 0 else env[t] if t in env else self._const(static, t) for t in ins]
            try:
                res = OPS[name](self, vals, opts, dict(ins=ins, batch=batch,
                                                       static=[static.get(t) for t in ins]))
            except PockError:
                raise
            except Exception as e:
                raise PockError(f"TFLite operator {i} ({name}, output {self._out_name(i)!r}) failed: "
                                f"{type(e).__name__}: {e}") from e
            for t, r in zip(outs, res if isinstance(res, (tuple, list)) else (res,)):
                env[t] = r
        res = [env[t] if t in env else self._const(static, t) for t in self._outputs]
        return res[0] if len(res) == 1 else tuple(res)

    def _const(self, static, t):
        if t in self._consts:
            return self._consts[t]
        return torch.from_numpy(np.array(static[t]))


# -- operators -------------------------------------------------------------------------------
def _act(x, opts):
    a = opts.get("FusedActivationFunction", 0)
    if a not in _FUSED:
        raise PockError(f"fused activation {a} is not supported")
    return x if _FUSED[a] is None else _FUSED[a](x)


def _same_pad(size, k, s, d):
    out = -(-size // s)
    total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
    return total // 2, total - total // 2


def _nchw(x):
    return x.permute(0, 3, 1, 2)


def _nhwc(x):
    return x.permute(0, 2, 3, 1)


def _pad_for(x, opts, kh, kw):
    """x NCHW; TFLite SAME padding (possibly asymmetric) as an explicit pad, VALID as none."""
    if opts.get("Padding", 1) != 0:  # 0 = SAME, 1 = VALID
        return x
    sh, sw = opts.get("StrideH", 1), opts.get("StrideW", 1)
    dh, dw = opts.get("DilationHFactor", 1), opts.get("DilationWFactor", 1)
    top, bottom = _same_pad(x.shape[2], kh, sh, dh)
    left, right = _same_pad(x.shape[3], kw, sw, dw)
    return F.pad(x, (left, right, top, bottom)) if top or bottom or left or right else x


def _conv(m, v, o, c, groups=None):
    x, w, b = v[0], v[1], v[2] if len(v) > 2 else None
    x = _nchw(x)
    g = x.shape[1] if groups == "depthwise" else 1
    x = _pad_for(x, o, w.shape[2], w.shape[3])
    y = F.conv2d(x, w, b, stride=(o.get("StrideH", 1), o.get("StrideW", 1)),
                 dilation=(o.get("DilationHFactor", 1), o.get("DilationWFactor", 1)), groups=g)
    return _act(_nhwc(y), o)


def _pool(kind):
    def run(m, v, o, c):
        x = _nchw(v[0])
        kh, kw = o.get("FilterHeight", 1), o.get("FilterWidth", 1)
        stride = (o.get("StrideH", 1), o.get("StrideW", 1))
        if kind == "max":
            pads = (0, 0, 0, 0)
            if o.get("Padding", 1) == 0:  # SAME: pad with -inf, which max never picks
                top, bottom = _same_pad(x.shape[2], kh, stride[0], 1)
                left, right = _same_pad(x.shape[3], kw, stride[1], 1)
                pads = (left, right, top, bottom)
            if any(pads):
                x = F.pad(x, pads, value=float("-inf"))
            y = F.max_pool2d(x, (kh, kw), stride)
        else:
            if o.get("Padding", 1) == 0 and any(_same_pad(v[0].shape[1 + i], k, stride[i], 1) != (0, 0)
                                                for i, k in enumerate((kh, kw))):
                raise PockError("AVERAGE_POOL_2D with SAME padding that pads is not supported")
            y = F.avg_pool2d(x, (kh, kw), stride)
        return _act(_nhwc(y), o)
    return run


def _fully_connected(m, v, o, c):
    x, w, b = v[0], v[1], v[2] if len(v) > 2 else None
    shape = x.shape
    y = F.linear(x.reshape(-1, w.shape[1]) if not o.get("KeepNumDims", False) else x, w, b)
    if o.get("KeepNumDims", False):
        y = y.reshape(*shape[:-1], w.shape[0])
    return _act(y, o)


def _const_list(c, k, name):
    """Input k of the operator as a list of ints: it must be a constant of the file (read from the
    file's data, never from a traced tensor)."""
    arr = c["static"][k] if k < len(c["static"]) else None
    if arr is None:
        raise PockError(f"{name} must be a constant tensor of the file")
    return [int(s) for s in np.asarray(arr).reshape(-1).tolist()]


def _reshape(m, v, o, c):
    shape = _const_list(c, 1, "RESHAPE's shape") if len(v) > 1 and v[1] is not None else o.get("NewShape")
    if shape is None:
        raise PockError("RESHAPE without a target shape")
    if shape and c["batch"] is not None and m._file_batch not in (None, -1) and shape[0] == m._file_batch \
            and c["batch"] != m._file_batch:
        shape = [c["batch"], *shape[1:]]
    return v[0].reshape(shape)


def _binary(fn):
    return lambda m, v, o, c: _act(fn(v[0], v[1]), o)


def _reduce(fn):
    def run(m, v, o, c):
        axes = tuple(a % v[0].dim() for a in _const_list(c, 1, "the reduction axes"))
        return fn(v[0], dim=axes, keepdim=bool(o.get("KeepDims", False)))
    return run


def _softmax(m, v, o, c):
    beta = o.get("Beta", 1.0)
    return torch.softmax(v[0] * beta if beta != 1.0 else v[0], dim=-1)


def _concat(m, v, o, c):
    return _act(torch.cat(v, dim=o.get("Axis", 0)), o)


def _transpose(m, v, o, c):
    return v[0].permute(*_const_list(c, 1, "TRANSPOSE's permutation"))


def _pad(m, v, o, c):
    pads = np.array(_const_list(c, 1, "PAD's paddings")).reshape(-1, 2)
    flat = [int(p) for pair in pads[::-1] for p in pair]
    value = float(np.asarray(c["static"][2]).reshape(-1)[0]) if len(v) > 2 and c["static"][2] is not None else 0.0
    return F.pad(v[0], flat, value=value)


def _batch_matmul(m, v, o, c):
    a, b = v[0], v[1]
    if o.get("AdjX", False):
        a = a.transpose(-1, -2)
    if o.get("AdjY", False):
        b = b.transpose(-1, -2)
    return torch.matmul(a, b)


def _squeeze(m, v, o, c):
    dims = o.get("SqueezeDims") or [i for i, s in enumerate(v[0].shape) if s == 1]
    x = v[0]
    for d in sorted((d % x.dim() for d in dims), reverse=True):
        x = x.squeeze(d)
    return x


def _gather(m, v, o, c):
    params, ids = v[0], v[1]
    if o.get("Axis", 0) != 0:
        raise PockError("GATHER along an axis other than 0 is not supported")
    return F.embedding(ids.long(), params)


def _strided_slice(m, v, o, c):
    if o.get("EllipsisMask", 0) or o.get("NewAxisMask", 0) or o.get("Offset", False):
        raise PockError("STRIDED_SLICE with ellipsis/new-axis masks is not supported")
    x = v[0]
    begin, end, strides = (_const_list(c, k, "STRIDED_SLICE's begin/end/strides") for k in (1, 2, 3))
    idx = []
    for d in range(len(begin)):
        b = None if o.get("BeginMask", 0) >> d & 1 else begin[d]
        e = None if o.get("EndMask", 0) >> d & 1 else end[d]
        if o.get("ShrinkAxisMask", 0) >> d & 1:
            idx.append(begin[d])
        else:
            idx.append(slice(b, e, strides[d]))
    return x[tuple(idx)]


OPS = {
    "CONV_2D": _conv,
    "DEPTHWISE_CONV_2D": lambda m, v, o, c: _conv(m, v, o, c, groups="depthwise"),
    "FULLY_CONNECTED": _fully_connected,
    "MAX_POOL_2D": _pool("max"),
    "AVERAGE_POOL_2D": _pool("avg"),
    "ADD": _binary(torch.add), "SUB": _binary(torch.sub), "MUL": _binary(torch.mul), "DIV": _binary(torch.div),
    "SQUARED_DIFFERENCE": lambda m, v, o, c: (v[0] - v[1]) * (v[0] - v[1]),
    "MAXIMUM": lambda m, v, o, c: torch.maximum(v[0], v[1]),
    "MINIMUM": lambda m, v, o, c: torch.minimum(v[0], v[1]),
    "RELU": lambda m, v, o, c: F.relu(v[0]),
    "RELU6": lambda m, v, o, c: F.relu6(v[0]),
    "LEAKY_RELU": lambda m, v, o, c: F.leaky_relu(v[0], o.get("Alpha", 0.2)),
    "LOGISTIC": lambda m, v, o, c: torch.sigmoid(v[0]),
    "TANH": lambda m, v, o, c: torch.tanh(v[0]),
    "GELU": lambda m, v, o, c: F.gelu(v[0], approximate="tanh" if o.get("Approximate", False) else "none"),
    "EXP": lambda m, v, o, c: torch.exp(v[0]),
    "SQRT": lambda m, v, o, c: torch.sqrt(v[0]),
    "RSQRT": lambda m, v, o, c: torch.rsqrt(v[0]),
    "NEG": lambda m, v, o, c: -v[0],
    "HARD_SWISH": lambda m, v, o, c: F.hardswish(v[0]),
    "SOFTMAX": _softmax,
    "LOG_SOFTMAX": lambda m, v, o, c: torch.log_softmax(v[0], dim=-1),
    "RESHAPE": _reshape,
    "SQUEEZE": _squeeze,
    "EXPAND_DIMS": lambda m, v, o, c: v[0].unsqueeze(_const_list(c, 1, "EXPAND_DIMS's axis")[0]),
    "MEAN": _reduce(torch.mean),
    "SUM": _reduce(torch.sum),
    "CONCATENATION": _concat,
    "TRANSPOSE": _transpose,
    "PAD": _pad,
    "PADV2": _pad,
    "BATCH_MATMUL": _batch_matmul,
    "GATHER": _gather,
    "STRIDED_SLICE": _strided_slice,
}


# Shape bookkeeping (SHAPE and what computes on its result, e.g. the batch-dependent RESHAPE
# targets a converter emits for Keras attention) is evaluated in numpy while tracing: the values
# depend only on static shapes and constants, so the traced step carries none of it.
def _fold_reduce(fn):
    def run(v, shapes, o):
        axes = tuple(int(a) for a in np.asarray(v[1]).reshape(-1))
        return fn(v[0], axis=axes, keepdims=bool(o.get("KeepDims", False)))
    return run


def _fold_slice(v, shapes, o):
    x = v[0]
    begin, end, strides = (np.asarray(t).reshape(-1) for t in v[1:4])
    idx = []
    for d in range(len(begin)):
        b = None if o.get("BeginMask", 0) >> d & 1 else int(begin[d])
        e = None if o.get("EndMask", 0) >> d & 1 else int(end[d])
        idx.append(int(begin[d]) if o.get("ShrinkAxisMask", 0) >> d & 1 else slice(b, e, int(strides[d])))
    return np.asarray(x[tuple(idx)])


_FOLD = {
    "SHAPE": lambda v, shapes, o: np.array(shapes[0], np.int32),
    "GATHER": lambda v, shapes, o: np.take(v[0], np.asarray(v[1]).astype(np.int64), axis=o.get("Axis", 0)),
    "REDUCE_PROD": _fold_reduce(np.prod),
    "PACK": lambda v, shapes, o: np.stack([np.asarray(a) for a in v], axis=o.get("Axis", 0)),
    "CONCATENATION": lambda v, shapes, o: np.concatenate([np.asarray(a).reshape(-1) if np.ndim(a) == 0 else a
                                                          for a in v], axis=o.get("Axis", 0)),
    "STRIDED_SLICE": _fold_slice,
    "ADD": lambda v, shapes, o: np.asarray(v[0] + v[1]),
    "SUB": lambda v, shapes, o: np.asarray(v[0] - v[1]),
    "MUL": lambda v, shapes, o: np.asarray(v[0] * v[1]),
    "CAST": lambda v, shapes, o: np.asarray(v[0]),
    "RESHAPE": lambda v, shapes, o: np.reshape(v[0], [int(s) for s in np.asarray(v[1]).reshape(-1)]),
    "SQUEEZE": lambda v, shapes, o: np.squeeze(v[0]),
    "EXPAND_DIMS": lambda v, shapes, o: np.expand_dims(v[0], int(np.asarray(v[1]).reshape(-1)[0])),
}


def export_tflite(trainer, src, dst) -> Path:
    """Write `src`'s .tflite model to `dst` with the trainer's current weights, in place in the
    flatbuffer (same size, same structure), in the file's own layouts."""
    buf = bytearray(_read(src))
    module = TFLiteModule(bytes(buf))
    f = _File(bytes(buf))
    state = trainer.state_dict()
    back = module.tflite_layout()
    written = 0
    for pname, t in module.tflite_tensor().items():
        if pname not in state:
            continue
        arr = np.asarray(state[pname], dtype=np.float32)
        if pname in back:
            arr = arr.transpose(back[pname])
        shape = f.tensors[t][1]
        if tuple(arr.shape) != tuple(shape):
            raise PockError(f"trainer tensor {pname!r} has shape {tuple(arr.shape)}, the file's {shape}")
        start, length = f.data_span(t)
        data = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        if len(data) != length:
            raise PockError(f"TFLite tensor {pname!r}: {length} bytes in the file, {len(data)} to write")
        buf[start:start + length] = data
        written += 1
    if not written:
        raise PockError(f"no tensor of {str(src)!r} is a tensor of this trainer; export to the .tflite file "
                        "the program was compiled from")
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".tmp")
    tmp.write_bytes(bytes(buf))
    tmp.replace(dst)
    return dst
