"""The reference backend: the training step run by a PyTorch interpreter of the IR.

    trainer = prog.build(backends=["reference", "cpu"])   # no C++, no device: the IR in torch

It is the null backend of the registry (tinygrad keeps one for tests that need no device,
ggml checks every backend against its CPU): nothing is generated or compiled, so it runs
wherever PyTorch does, and tests/backends/test_reference.py checks every other registered
backend against it on the same program.

How a step runs (ReferenceTrainer.step):
  - the step graph's forward nodes, in order, each by its op record's torch function
    (`torch`, or `torch_train` for the losses and train-mode BatchNorm; `assign` below),
    with the trained parameters as autograd leaves;
  - the gradients by torch.autograd from the graph's loss (the graph's own backward nodes
    are not run: this is the independent reference for them);
  - each update node (sgd_update / adamw_update) on its region of the parameter with
    torch.optim's formulas, then the deferred `assign`s (BatchNorm running statistics);
  - the non-finite guard as pock.h: a NaN/inf input, loss or gradient applies nothing.
Inference (forward) interprets the inference graph the same way.  `dtype=torch.float64`
gives an fp64 reference.  An op with no torch function here (an LSTM, dropout: random
numbers the C++ step draws differently) is a PockError naming it at build time.
"""
from __future__ import annotations

import hashlib
import math
from contextlib import contextmanager

import numpy as np
import torch

from ..codegen import Source
from ..errors import PockError
from ..ops import REGISTRY
from . import Backend, Device, register

_DTYPES = {"f32": torch.float32, "i64": torch.int64, "i32": torch.int32, "u8": torch.uint8}


def torch_fn(op: str):
    """The torch function the interpreter runs for `op`: its record's torch reference, or the
    training-only one (losses, train-mode BatchNorm: torch_train); None when it has neither."""
    r = REGISTRY.get(op)
    return None if r is None else (r.torch or r.torch_train)


DEFERRED = {"assign"}  # state writes, applied after the updates (as the step's last nodes)
UPDATES = {"sgd_update", "adamw_update"}


def supports(node) -> bool:
    return torch_fn(node.op) is not None or node.op in DEFERRED or node.op in UPDATES


def _run_node(n, env):
    ins = [None if v is None else env[id(v)] for v in n.inputs]
    ys = torch_fn(n.op)(ins, n.attrs)
    ys = list(ys) if isinstance(ys, (tuple, list)) else [ys]
    for o, y in zip(n.outputs, ys):
        if o is not None and y is not None:
            env[id(o)] = y


def _check_graph(graph, what: str) -> None:
    for n in graph.nodes:
        if n.phase != "backward" and not supports(n):
            raise PockError(f"the reference backend has no torch function for op {n.op!r} "
                            f"({n.source or 'the model'}) in the {what}")
    for name, v in graph.state.items():
        if v.dtype not in _DTYPES:
            raise PockError(f"the reference backend runs fp32 state; {name!r} is {v.dtype} "
                            f"(compile with frozen_dtype='fp32')")


def _region(t: torch.Tensor, region) -> torch.Tensor:
    """The updated part of a parameter: region (outer, k, inner) views it as
    [outer, inner] and takes the first k columns (optim/optimizers.update_region)."""
    outer, k, inner = region
    return t.reshape(outer, inner)[:, :k]


class ReferenceTrainer:
    """Trainer's step/forward/state API over the torch interpreter (this module's docstring)."""

    def __init__(self, prog, dtype=torch.float32):
        _check_graph(prog.graph, "training step")
        _check_graph(prog.forward_graph, "inference pass")
        self.prog, self.dtype = prog, dtype
        self.lib_path = None
        self.partition = None
        self.step_count = 0
        self.learning_rate = float(prog.optimizer.lr)
        self.skipped_steps = 0
        self.last_step_status = "ok"
        self.closed = False
        self.state = {name: self._tensor(v.data, v.dtype) for name, v in prog.state.items() if v.data is not None}
        self._order = [name for name, v in sorted(prog.state.items(), key=lambda kv: prog.state_offsets[kv[0]])
                       if v.kind in ("param", "buffer")]
        self._aliases = dict(prog.aliases)
        self.lora_adapters, self.trained_names, self.decoder = dict(prog.lora_adapters), list(prog.trained), prog.decoder

    def _tensor(self, data, dtype: str) -> torch.Tensor:
        t = torch.from_numpy(np.array(data, copy=True))
        return t.to(self.dtype) if dtype == "f32" else t

    def _inputs(self, graph, values, ios, what):
        seq = list(values) if isinstance(values, (tuple, list)) else [values]
        if len(seq) != len(ios):
            raise PockError(f"expected {len(ios)} {what}s ({', '.join(v.name for v in ios)}), got {len(seq)}")
        out = {}
        for k, (x, v) in enumerate(zip(seq, ios)):
            t = x.detach().cpu() if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
            if tuple(t.shape) != tuple(v.shape):
                raise PockError(f"{what} {k} {v.name!r}: expected shape {tuple(v.shape)}, got {tuple(t.shape)}")
            out[id(v)] = t.to(self.dtype) if v.dtype == "f32" else t.to(_DTYPES[v.dtype])
        return out

    def _env(self, graph, inputs, leaves=None):
        env = {id(v): (leaves or {}).get(name, self.state.get(name)) for name, v in graph.state.items()}
        env.update(inputs)
        return env

    # ---- training
    def step(self, inputs, targets) -> float:
        with _one_thread():
            return self._step(inputs, targets)

    def _step(self, inputs, targets) -> float:
        if self.closed:
            raise PockError("trainer is closed")
        g = self.prog.graph
        feeds = self._inputs(g, inputs, g.inputs, "input")
        feeds.update(self._inputs(g, targets, g.targets, "target"))
        updates = [n for n in g.nodes if n.op in UPDATES]
        names = list(dict.fromkeys(n.inputs[0].name for n in updates))
        leaves = {name: self.state[name].clone().requires_grad_(True) for name in names}
        env = self._env(g, feeds, leaves)
        assigns = []
        for n in g.nodes:
            if n.phase == "backward" or n.op in UPDATES:
                continue
            if n.op in DEFERRED:
                assigns.append(n)
                continue
            _run_node(n, env)
        loss = env[id(g.loss)]
        grads = torch.autograd.grad(loss, [leaves[n] for n in names], allow_unused=True) if names else []
        grads = {name: torch.zeros_like(leaves[name]) if gr is None else gr for name, gr in zip(names, grads)}
        finite = bool(torch.isfinite(loss)) and all(bool(torch.isfinite(t).all()) for t in feeds.values()
                                                     if t.is_floating_point())
        finite = finite and all(bool(torch.isfinite(_region(grads[n.inputs[0].name], n.attrs["region"])).all())
                                for n in updates)
        if not finite:
            self.skipped_steps += 1
            self.last_step_status = "skipped"
            return float(loss.detach())
        t = self.step_count + 1
        with torch.no_grad():
            for n in updates:
                name = n.inputs[0].name
                p = _region(self.state[name], n.attrs["region"])
                grad = _region(grads[name], n.attrs["region"])
                slots = [self.state[v.name].view(grad.shape) for v in n.inputs[2:] if v is not None]
                (_sgd if n.op == "sgd_update" else _adamw)(p, grad, slots, n.attrs, self.learning_rate, t)
            for n in assigns:
                dst = self.state[n.inputs[0].name]
                dst.copy_(env[id(n.inputs[1])].detach().to(dst.dtype))
        self.step_count = t
        self.last_step_status = "ok"
        return float(loss.detach())

    def forward(self, inputs):
        fg = self.prog.forward_graph
        env = self._env(fg, self._inputs(fg, inputs, fg.inputs, "input"))
        with torch.no_grad(), _one_thread():
            for n in fg.nodes:
                if n.op not in DEFERRED:
                    _run_node(n, env)
        outs = [env[id(v)].numpy() for v in fg.outputs]  # fp64 for an fp64 reference
        return outs[0] if len(outs) == 1 else tuple(outs)

    # ---- state
    def get_tensor(self, name: str) -> np.ndarray:
        name = self._aliases.get(name, name)
        if name not in self.state:
            raise PockError(f"unknown state tensor {name!r}")
        return self.state[name].numpy().copy()  # fp64 for an fp64 reference

    def state_dict(self) -> dict[str, np.ndarray]:
        sd = {name: self.get_tensor(name) for name in self._order}
        sd.update({a: sd[c] for a, c in self._aliases.items() if c in sd})
        return sd

    def load_state_dict(self, state_dict) -> None:
        missing = [n for n in self._order if n not in state_dict]
        if missing:
            raise PockError("load_state_dict: missing keys: " + ", ".join(map(repr, missing)))
        for name in self._order:
            self.state[name] = self._tensor(np.asarray(state_dict[name]), self.prog.state[name].dtype)

    def close(self) -> None:
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextmanager
def _one_thread():
    """PyTorch on one thread while the interpreter runs: its ops here are tiny, and on a busy
    machine the thread pool's hand-offs cost ~80x (measured: MLP step 434 ms on 2 threads at
    load 18, 5.5 ms on one)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def _sgd(p, g, slots, a, lr, t):
    """torch.optim.SGD on p (in place) for gradient g; slots = [momentum_buffer] with momentum."""
    d = g + a["weight_decay"] * p if a["weight_decay"] else g
    if a["momentum"]:
        buf = slots[0]
        if t == 1:
            buf.copy_(d)
        else:
            buf.mul_(a["momentum"]).add_(d, alpha=1 - a["dampening"])
        d = d + a["momentum"] * buf if a["nesterov"] else buf
    p.sub_(lr * d)


def _adamw(p, g, slots, a, lr, t):
    """torch.optim.AdamW on p (in place); slots = [exp_avg, exp_avg_sq]."""
    m, v = slots
    b1, b2 = a["beta1"], a["beta2"]
    p.mul_(1 - lr * a["weight_decay"])
    m.mul_(b1).add_(g, alpha=1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)
    bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
    denom = (v.sqrt() / math.sqrt(bc2)).add_(a["eps"])
    p.addcdiv_(m, denom, value=-lr / bc1)


def emit_reference(prog, cost=None, options=None) -> Source:
    """No code: the Source is the step graph's listing (what the interpreter runs)."""
    text = prog.graph.dump()
    return Source(text, hashlib.sha256(text.encode()).hexdigest()[:16], ("reference", "cpu"))


def build_reference(prog, source=None, out_dir=None, dtype=torch.float32) -> ReferenceTrainer:
    return ReferenceTrainer(prog, dtype)


register(Backend(
    "reference", Device(flops_per_s=1e9, dispatch_s=1e-5),
    supports=supports, emit=emit_reference, build=build_reference,
    platforms=(),  # a test backend: nothing to ship
    doc="the null backend: the IR interpreted by PyTorch (autograd for the gradients), the reference "
        "every other backend is checked against"))
