"""JAX frontend: a JAX function and its parameter pytree → a torch module → the torch path.

    prog = pe.compile(pe.from_jax(apply, params), example_inputs=(x,), example_targets=(y,), ...)
    new_params = pe.jax_params(trainer, params)     # the trained pytree, same structure

`apply(params, *inputs)` is traced once with `jax.make_jaxpr` (for the example
inputs' shapes); `JaxModule` then runs that jaxpr with torch ops, one small
function per JAX primitive in `PRIMITIVES`, holding the pytree's leaves as
parameters named by their pytree path ("dense1.kernel", "layers.0.w"). So
gradients, sparse updates and every backend come from the torch path, and the
training semantics are `jax.grad` of the same function. Equations whose inputs
are all constants (masks built from iota, shape arithmetic) are evaluated by
JAX itself while tracing. jax.nn's jitted activations (relu, softmax,
log_softmax, silu, sigmoid) are mapped whole to their torch twins. A primitive
not in `PRIMITIVES` is a PockError naming the equation.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import PockError
from .named import set_named_tensor


class JaxModel:
    """What `pe.from_jax(fn, params)` returns: the function and its parameter pytree."""

    def __init__(self, fn, params):
        if not callable(fn):
            raise PockError(f"from_jax needs a function apply(params, *inputs), got {type(fn).__name__}")
        self.fn = fn
        self.params = params

    def to_torch(self) -> nn.Module:
        return JaxModule(self.fn, self.params)


def from_jax(fn, params) -> JaxModel:
    """A JAX function `fn(params, *inputs) -> outputs` and its parameters, for pe.compile."""
    return JaxModel(fn, params)


def leaf_names(params) -> list[tuple[str, object]]:
    """[(pytree path as a dotted name, leaf)] in pytree order."""
    import jax
    flat, _ = jax.tree_util.tree_flatten_with_path(params)
    out = []
    for path, leaf in flat:
        parts = []
        for k in path:
            for attr in ("key", "idx", "name"):
                if hasattr(k, attr):
                    parts.append(str(getattr(k, attr)))
                    break
            else:
                parts.append(str(k))
        out.append((".".join(parts) or "param", leaf))
    return out


def jax_params(trainer, params):
    """`params` (a pytree) with every leaf replaced by the trainer's trained value of that name."""
    import jax
    import jax.numpy as jnp
    state = trainer.state_dict()
    leaves = []
    for name, leaf in leaf_names(params):
        if name not in state:
            raise PockError(f"the trainer has no tensor {name!r}; was it compiled from these params?")
        leaves.append(jnp.asarray(state[name], dtype=jnp.asarray(leaf).dtype).reshape(np.shape(leaf)))
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(params), leaves)


_JAX_DTYPES = {torch.float32: np.float32, torch.int64: np.int32, torch.int32: np.int32, torch.bool: np.bool_}


class JaxModule(nn.Module):
    """Runs `fn(params, *inputs)`'s jaxpr with torch ops; parameters named by pytree path."""

    def __init__(self, fn, params):
        super().__init__()
        self._fn = fn
        self._names = []
        for name, leaf in leaf_names(params):
            arr = np.asarray(leaf)
            if arr.dtype != np.float32:
                raise PockError(f"JAX parameter {name!r} is {arr.dtype}; PockEngine trains float32 parameters")
            set_named_tensor(self, name, torch.from_numpy(arr.copy()))
            self._names.append(name)
        self._params = params
        self._jaxprs = {}

    def _jaxpr(self, inputs):
        import jax
        key = tuple((tuple(t.shape), t.dtype) for t in inputs)
        if key not in self._jaxprs:
            specs = []
            for i, t in enumerate(inputs):
                if t.dtype not in _JAX_DTYPES:
                    raise PockError(f"input {i} has dtype {t.dtype}; the JAX frontend takes float32 or integer inputs")
                specs.append(jax.ShapeDtypeStruct(tuple(t.shape), _JAX_DTYPES[t.dtype]))
            try:
                self._jaxprs[key] = jax.make_jaxpr(self._fn)(self._params, *specs)
            except Exception as e:
                raise PockError(f"jax.make_jaxpr could not trace the function: {type(e).__name__}: {e}") from e
        return self._jaxprs[key]

    def forward(self, *inputs):
        closed = self._jaxpr(inputs)
        leaves = [self.get_parameter(n) for n in self._names]
        args = leaves + list(inputs)  # integer inputs stay int64 in torch (int32 in the jaxpr)
        outs = run_jaxpr(closed.jaxpr, list(closed.consts), args)
        outs = [_tensor(o) for o in outs]
        return outs[0] if len(outs) == 1 else tuple(outs)


# -- the interpreter: values are torch tensors (computed) or numpy arrays (constants) -----------
def _static(v) -> bool:
    return not isinstance(v, torch.Tensor)


def _tensor(v):
    if isinstance(v, torch.Tensor):
        return v
    arr = np.asarray(v)
    if arr.dtype == np.float64:
        arr = arr.astype(np.float32)
    return torch.from_numpy(arr.copy())


def run_jaxpr(jaxpr, consts, args):
    """Three passes: fold constant equations with JAX, keep only the equations the outputs
    need (a select_n with a constant predicate needs only the case it picks), run those in torch.
    Integer inputs are indices, assumed non-negative: `idx < 0` (JAX's wrap-around of negative
    indices) is constant false, so indexing `table[idx]` is a plain lookup."""
    from jax.extend.core import Literal
    env, alias = {}, {}
    for var, val in zip(jaxpr.constvars, consts):
        env[var] = np.asarray(val)
    for var, val in zip(jaxpr.invars, args):
        env[var] = val

    def known(v):
        return isinstance(v, Literal) or (v in env and _static(env[v]))

    def read(v):
        if isinstance(v, Literal):
            return np.asarray(v.val)
        return read(alias[v]) if v in alias else env[v]

    dynamic = []
    shifts = _stabilizing_maxes(jaxpr)
    implicit = _implicit_broadcasts(jaxpr)
    for eqn in jaxpr.eqns:  # pass 1: constants
        name = eqn.primitive.name
        if id(eqn) in implicit and not known(eqn.invars[0]):
            alias[eqn.outvars[0]] = eqn.invars[0]
        elif id(eqn) in shifts:  # softmax's max-shift: shift invariant, so a zero shift is exact maths
            env[eqn.outvars[0]] = np.zeros(eqn.outvars[0].aval.shape, np.float32)
        elif all(known(v) for v in eqn.invars):
            outs = eqn.primitive.bind(*[read(v) for v in eqn.invars], **eqn.params)
            for var, o in zip(eqn.outvars, outs if eqn.primitive.multiple_results else [outs]):
                env[var] = np.asarray(o)
        elif name == "lt" and known(eqn.invars[1]) and not np.any(read(eqn.invars[1])) and \
                np.issubdtype(np.dtype(eqn.invars[0].aval.dtype), np.integer):
            env[eqn.outvars[0]] = np.zeros(eqn.outvars[0].aval.shape, bool)  # indices are >= 0
        elif name == "select_n" and known(eqn.invars[0]) and np.ptp(read(eqn.invars[0]).astype(int)) == 0:
            alias[eqn.outvars[0]] = eqn.invars[1 + int(np.asarray(read(eqn.invars[0])).flat[0])]
        else:
            dynamic.append(eqn)
    needed = {v for v in jaxpr.outvars if not isinstance(v, Literal)}
    for v in list(needed):
        while v in alias:
            v = alias[v]
            needed.add(v)
    live = []
    for eqn in reversed(dynamic):  # pass 2: what the outputs need
        if any(v in needed for v in eqn.outvars):
            live.append(eqn)
            for v in eqn.invars:
                while not isinstance(v, Literal):
                    needed.add(v)
                    if v not in alias:
                        break
                    v = alias[v]
    for eqn in reversed(live):  # pass 3: torch
        vals = [read(v) for v in eqn.invars]
        name = eqn.primitive.name
        label = f"{name} ({eqn.source_info.name_stack})" if str(eqn.source_info.name_stack) else name
        fn = PRIMITIVES.get(name)
        if fn is None:
            raise PockError(f"JAX equation {label}: primitive {name!r} is not supported by PockEngine's JAX "
                            f"frontend (supported: {', '.join(sorted(PRIMITIVES))})")
        try:
            outs = fn(vals, **eqn.params)
        except PockError:
            raise
        except Exception as e:
            raise PockError(f"JAX equation {label}: {type(e).__name__}: {e}") from e
        for var, val in zip(eqn.outvars, list(outs) if eqn.primitive.multiple_results else [outs]):
            env[var] = val
    return [read(v) for v in jaxpr.outvars]


def _stabilizing_maxes(jaxpr) -> set:
    """reduce_max equations used only through stop_gradient (jax.nn.softmax / log_softmax's
    `x - stop_gradient(max(x))`): the shift cancels, so PockEngine uses 0 and saves the
    reduction (logits stay far below exp's fp32 overflow at 88 in the models this trains).
    Any other reduce_max / reduce_min is an amax / amin."""
    users = {}
    for eqn in jaxpr.eqns:
        for v in eqn.invars:
            if not _is_literal(v):
                users.setdefault(v, []).append(eqn)
    out = set()
    for eqn in jaxpr.eqns:
        if eqn.primitive.name != "reduce_max":
            continue
        frontier, ok = list(eqn.outvars), True
        while frontier and ok:
            for u in users.get(frontier.pop(), []):
                if u.primitive.name == "stop_gradient":
                    continue
                if u.primitive.name in ("max", "broadcast_in_dim", "reshape", "expand_dims"):
                    frontier.extend(u.outvars)
                else:
                    ok = False
        if ok and not any(v is o for v in eqn.outvars for o in jaxpr.outvars):
            out.add(id(eqn))
    return out


_ELEMENTWISE = {"add", "sub", "mul", "div", "max", "select_n"}


def _implicit_broadcasts(jaxpr) -> set:
    """broadcast_in_dim equations that only add leading 1s and feed only elementwise ops: torch
    broadcasting does them implicitly, so they are skipped (a bias then meets the activations
    untouched rather than through a reshape of the parameter)."""
    users = {}
    for eqn in jaxpr.eqns:
        for v in eqn.invars:
            if not _is_literal(v):
                users.setdefault(v, []).append(eqn)
    out = set()
    for eqn in jaxpr.eqns:
        if eqn.primitive.name != "broadcast_in_dim" or _is_literal(eqn.invars[0]):
            continue
        src, dst = tuple(eqn.invars[0].aval.shape), tuple(eqn.params["shape"])
        k = len(dst) - len(src)
        if dst != (1,) * k + src or any(v is o for v in eqn.outvars for o in jaxpr.outvars):
            continue
        if all(u.primitive.name in _ELEMENTWISE and all(
                _is_literal(w) or w is eqn.outvars[0] or len(w.aval.shape) >= len(dst) for w in u.invars)
               for u in users.get(eqn.outvars[0], [])):
            out.add(id(eqn))
    return out


def _is_literal(v) -> bool:
    from jax.extend.core import Literal
    return isinstance(v, Literal)


PRIMITIVES = {}


def prim(*names):
    def register(fn):
        for n in names:
            PRIMITIVES[n] = fn
        return fn
    return register


def _arg(v):
    """A constant operand as a Python scalar when it is one (torch ops take those), else a tensor."""
    if _static(v) and np.ndim(v) == 0:
        return np.asarray(v).item()
    return _tensor(v)


for _n, _f in [("add", torch.add), ("sub", torch.sub), ("mul", torch.mul), ("div", torch.div)]:
    PRIMITIVES[_n] = (lambda f: lambda v, **p: f(_arg(v[0]), _arg(v[1])) if not _static(v[0])
                      else f(_tensor(v[0]), _arg(v[1])))(_f)
for _n, _f in [("exp", torch.exp), ("log", torch.log), ("tanh", torch.tanh), ("logistic", torch.sigmoid),
               ("sqrt", torch.sqrt), ("rsqrt", torch.rsqrt), ("neg", torch.neg), ("abs", torch.abs),
               ("erf", torch.erf), ("stop_gradient", torch.Tensor.detach)]:
    PRIMITIVES[_n] = (lambda f: lambda v, **p: f(v[0]))(_f)


@prim("integer_pow")
def _integer_pow(v, y):
    return v[0] * v[0] if y == 2 else torch.pow(v[0], y)


@prim("square")
def _square(v):
    return v[0] * v[0]


@prim("max")
def _max(v):
    a, b = v
    if _static(b) and not np.any(b):
        return torch.relu(a)
    if _static(a) and not np.any(a):
        return torch.relu(b)
    return torch.maximum(_tensor(a), _tensor(b))


@prim("min")
def _min(v):
    return torch.minimum(_tensor(v[0]), _tensor(v[1]))


for _n, _f in (("gt", torch.gt), ("lt", torch.lt), ("ge", torch.ge), ("le", torch.le), ("eq", torch.eq),
               ("ne", torch.ne)):
    PRIMITIVES[_n] = (lambda f: lambda v, **p: f(_tensor(v[0]), _tensor(v[1])))(_f)


@prim("scan")
def _scan(v, jaxpr, length, reverse=False, num_consts=0, num_carry=0, **p):
    """lax.scan unrolled: `length` calls of the body, carries threaded through, outputs stacked."""
    consts, carry, xs = v[:num_consts], list(v[num_consts:num_consts + num_carry]), v[num_consts + num_carry:]
    ys = [None] * length
    for i in (range(length - 1, -1, -1) if reverse else range(length)):
        outs = _inline(jaxpr, [*consts, *carry, *(x[i] for x in xs)])
        carry, ys[i] = list(outs[:num_carry]), outs[num_carry:]
    stacked = []
    for k in range(len(ys[0]) if length else 0):
        col = [y[k] for y in ys]
        stacked.append(np.stack(col) if all(_static(c) for c in col) else torch.stack([_tensor(c) for c in col]))
    return [*carry, *stacked]


@prim("convert_element_type")
def _convert(v, new_dtype, **p):
    dt = {"float32": torch.float32, "int32": torch.int32, "int64": torch.int64, "bool": torch.bool}.get(str(new_dtype))
    if dt is None:
        raise PockError(f"convert_element_type to {new_dtype} is not supported")
    x = v[0]
    if x.dtype == dt or not x.is_floating_point() and dt in (torch.int32, torch.int64):
        return x  # index tensors stay int64 (the jaxpr's int32)
    return x.to(dt)


@prim("dot_general")
def _dot_general(v, dimension_numbers, **p):
    a, b = _tensor(v[0]), _tensor(v[1])
    (ca, cb), (ba, bb) = dimension_numbers
    fa = [d for d in range(a.dim()) if d not in ca and d not in ba]
    fb = [d for d in range(b.dim()) if d not in cb and d not in bb]
    if not ba and list(ca) == [a.dim() - 1] and list(cb) == [0] and b.dim() == 2:
        return torch.matmul(a, b)  # x @ W, the common case, stays one linear-like matmul
    batch = [a.shape[d] for d in ba]
    k = int(np.prod([a.shape[d] for d in ca]))
    m, n = int(np.prod([a.shape[d] for d in fa])), int(np.prod([b.shape[d] for d in fb]))
    a3 = a.permute(*ba, *fa, *ca).reshape(*batch, m, k)
    b3 = b.permute(*bb, *cb, *fb).reshape(*batch, k, n)
    out = torch.matmul(a3, b3)
    return out.reshape(*batch, *[a.shape[d] for d in fa], *[b.shape[d] for d in fb])


@prim("broadcast_in_dim")
def _broadcast_in_dim(v, shape, broadcast_dimensions, **p):
    x = _tensor(v[0])
    view = [1] * len(shape)
    for src, dst in enumerate(broadcast_dimensions):
        view[dst] = x.shape[src]
    x = x.reshape(view)
    return x if tuple(view) == tuple(shape) else x.expand(*shape)


@prim("reshape")
def _reshape(v, new_sizes, dimensions=None, **p):
    if dimensions is not None:
        raise PockError("reshape with dimensions is not supported")
    return _tensor(v[0]).reshape(*new_sizes)


@prim("transpose")
def _transpose(v, permutation):
    return _tensor(v[0]).permute(*permutation)


@prim("squeeze")
def _squeeze(v, dimensions):
    x = v[0]
    return x.reshape([s for i, s in enumerate(x.shape) if i not in dimensions])


@prim("expand_dims")
def _expand_dims(v, dimensions):
    x = v[0]
    for d in sorted(dimensions):
        x = x.unsqueeze(d)
    return x


@prim("reduce_sum")
def _reduce_sum(v, axes, **p):
    return v[0].sum(dim=list(axes)) if axes else v[0]


@prim("reduce_max")
def _reduce_max(v, axes, **p):
    """jnp.max over axes -> amax (the gradient shared between tied extremes, as torch does)."""
    return torch.amax(v[0], dim=list(axes)) if axes else v[0]


@prim("reduce_min")
def _reduce_min(v, axes, **p):
    return torch.amin(v[0], dim=list(axes)) if axes else v[0]


@prim("concatenate")
def _concatenate(v, dimension):
    return torch.cat([_tensor(t) for t in v], dimension)


@prim("split")
def _split(v, sizes, axis):
    return torch.split(v[0], list(sizes), axis)


@prim("slice")
def _slice(v, start_indices, limit_indices, strides=None):
    if strides is not None and any(s != 1 for s in strides):
        raise PockError(f"slice with strides {strides} is not supported")
    return v[0][tuple(slice(s, e) for s, e in zip(start_indices, limit_indices))]


@prim("select_n")
def _select_n(v):
    if len(v) != 3:
        raise PockError("select_n with more than two cases is not supported")
    pred = _tensor(v[0])
    return torch.where(pred if pred.dtype == torch.bool else pred != 0, _tensor(v[2]), _tensor(v[1]))


@prim("gather")
def _gather(v, dimension_numbers, slice_sizes, **p):
    """Row lookup (params[idx], jnp.take(table, idx, axis=0)): an embedding."""
    table, idx = v
    dn = dimension_numbers
    if (_static(table) or table.dim() != 2 or tuple(dn.collapsed_slice_dims) != (0,)
            or tuple(dn.start_index_map) != (0,) or tuple(slice_sizes) != (1, table.shape[1])):
        raise PockError(f"gather other than a row lookup (an embedding) is not supported: {dn}")
    idx = _tensor(idx)[..., 0]
    return F.embedding(idx if idx.dtype == torch.int64 else idx.to(torch.int64), table)


@prim("conv_general_dilated")
def _conv(v, window_strides, padding, lhs_dilation, rhs_dilation, dimension_numbers, feature_group_count,
          batch_group_count, **p):
    x, w = _tensor(v[0]), _tensor(v[1])
    if x.dim() != 4 or any(d != 1 for d in lhs_dilation) or batch_group_count != 1:
        raise PockError("only 2-d convolutions without input dilation are supported")
    lhs, rhs, out = dimension_numbers.lhs_spec, dimension_numbers.rhs_spec, dimension_numbers.out_spec
    pads = [tuple(pd) for pd in padding]
    if any(lo != hi for lo, hi in pads):
        raise PockError(f"asymmetric convolution padding {pads} is not supported; use symmetric (e.g. 'SAME' "
                        "with odd kernels)")
    y = F.conv2d(x.permute(*lhs), w.permute(*rhs), stride=list(window_strides), padding=[lo for lo, _ in pads],
                 dilation=list(rhs_dilation), groups=feature_group_count)
    return y.permute(*np.argsort(out).tolist())  # NCHW back to the function's layout


@prim("reduce_window_max")
def _max_pool(v, window_dimensions, window_strides, padding, base_dilation, window_dilation):
    x = v[0]
    spatial = [i for i, w in enumerate(window_dimensions) if w != 1]
    if x.dim() != 4 or len(spatial) != 2 or any(lo or hi for lo, hi in padding):
        raise PockError("only unpadded 2-d max pooling is supported")
    other = [i for i in range(4) if i not in spatial]
    perm = other + spatial
    y = F.max_pool2d(x.permute(*perm), [window_dimensions[i] for i in spatial],
                     [window_strides[i] for i in spatial])
    return y.permute(*np.argsort(perm).tolist())


_NAMED = {"relu": torch.relu, "silu": F.silu, "sigmoid": torch.sigmoid, "relu6": F.relu6}


@prim("pjit", "jit", "closed_call", "core_call", "remat", "checkpoint")
def _call(v, jaxpr=None, name=None, call_jaxpr=None, **p):
    inner = jaxpr if jaxpr is not None else call_jaxpr
    if name in _NAMED and len(v) == 1:
        return [_NAMED[name](v[0])]
    if name in ("softmax", "log_softmax", "_softmax", "_log_softmax") and len(v) == 1:
        axis = _softmax_axis(inner)
        return [(F.log_softmax if "log" in name else F.softmax)(v[0], axis)]
    return _inline(inner, v)


def _inline(closed, v):
    if hasattr(closed, "jaxpr"):
        return run_jaxpr(closed.jaxpr, list(closed.consts), v)
    return run_jaxpr(closed, [], v)


def _softmax_axis(closed):
    jaxpr = closed.jaxpr if hasattr(closed, "jaxpr") else closed
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in ("reduce_max", "reduce_sum") and len(eqn.params.get("axes", ())) == 1:
            return eqn.params["axes"][0]
        for sub in ("jaxpr", "call_jaxpr"):
            if sub in eqn.params:
                axis = _softmax_axis(eqn.params[sub])
                if axis is not None:
                    return axis
    raise PockError("could not find the axis of a softmax over several axes")


@prim("custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr")
def _custom(v, call_jaxpr=None, fun_jaxpr=None, num_consts=0, **p):
    # the primal function; its custom derivative is the mathematical one for what we support
    return _inline(call_jaxpr if call_jaxpr is not None else fun_jaxpr, v)


__all__ = ["from_jax", "jax_params", "JaxModel", "JaxModule"]
