"""The frozen prefix (passes/prefix.FrozenPrefix) as PyTorch: the module the prefix
backends export and the reference runner every other prefix runner is checked against.

    module = PrefixModule(prefix)    # torch.nn.Module: model inputs -> cut values (eval semantics, traceable)
    run = torch_runner(prefix)       # run(arrays) -> arrays, the same module under no_grad

backends/onnx_export.py exports the module to ONNX (the htp backend), backends/coreml.py
converts it with coremltools; each node runs its op record's `torch` reference."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

from ..ops import REGISTRY


class PrefixModule(nn.Module):
    """The prefix as a torch module over the frozen weights (eval semantics, traceable)."""

    def __init__(self, prefix):
        super().__init__()
        self._names: dict[str, str] = {}
        for i, name in enumerate(prefix.state_names()):
            v = prefix.graph.state[name]
            t = torch.from_numpy(np.array(v.data, copy=True))
            self.register_buffer(f"w{i}", t.bool() if v.dtype == "u8" else t)
            self._names[name] = f"w{i}"
        self._program = [(n.op, n.attrs, [None if v is None else id(v) for v in n.inputs],
                          [None if o is None else id(o) for o in n.outputs]) for n in prefix.nodes]
        self._input_ids = [id(prefix.graph.inputs[i]) for i in prefix.input_index]
        self._state_ids = {id(prefix.graph.state[name]): attr for name, attr in self._names.items()}
        self._out_ids = [id(v) for v in prefix.cut]
        self.output_names = [o["name"] for o in prefix.outputs]
        self.eval()

    def forward(self, *inputs):
        env = dict(zip(self._input_ids, inputs))
        env.update({key: getattr(self, attr) for key, attr in self._state_ids.items()})
        for op, attrs, ins, outs in self._program:
            fn, computed = REGISTRY[op].torch, REGISTRY[op].torch_outputs
            y = fn([None if i is None else env[i] for i in ins], attrs)
            ys = list(y) if isinstance(y, (tuple, list)) else [y]
            for o, t in zip(outs[:computed], ys):
                if o is not None:
                    env[o] = t
        outs = tuple(env[i] for i in self._out_ids)
        return outs[0] if len(outs) == 1 else outs


def torch_runner(prefix):
    """run(arrays) -> arrays: the prefix in PyTorch (the reference every other runner is checked against)."""
    module = PrefixModule(prefix)

    def run(arrays):
        with torch.no_grad():
            ins = [torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]
            ins = [t.bool() if io["dtype"] == "u8" else t for t, io in zip(ins, prefix.inputs)]
            out = module(*ins)
        outs = out if isinstance(out, tuple) else (out,)
        return [o.contiguous().numpy() for o in outs]
    return run


__all__ = ["PrefixModule", "torch_runner"]
