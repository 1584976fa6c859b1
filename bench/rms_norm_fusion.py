"""ms/step of a tiny Llama with and without the RMSNorm and SwiGLU fusions (passes/fuse_norm.py).

PYTHONPATH=toolchain .venv/bin/python bench/rms_norm_fusion.py [steps] [hidden]
Both variants are built first, then timed interleaved (A B A B ...) so machine load hits both alike.
"""
from __future__ import annotations

import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import pockengine as pe
from pockengine.compiler import program as P

HIDDEN = 128


def build(fused: bool):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, use_cache=False)
    model = LlamaForCausalLM(cfg).train()
    ids = torch.randint(0, 256, (4, 64))
    passes = [p for p in P.lowering_passes() if fused or p[0] not in ("RMSNorm fusion", "SwiGLU fusion")]
    spec = P.CompileSpec(model, (ids,), (ids,), loss="cross_entropy", output="logits", optimizer=pe.SGD(lr=1e-3))
    prog = P.compile_spec(spec, passes=passes)  # pe.compile's path, the two fusions left out when not fused
    n = sum(node.op in ("rms_norm", "swiglu") for node in prog.graph.nodes)
    return prog.build(), ids, n


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    global HIDDEN
    HIDDEN = int(sys.argv[2]) if len(sys.argv) > 2 else HIDDEN
    runs = {name: build(fused) for name, fused in (("unfused", False), ("fused", True))}
    times = {name: [] for name in runs}
    for name, (t, ids, _) in runs.items():
        for _ in range(3):
            t.step((ids,), (ids,))
    for _ in range(steps):
        for name, (t, ids, _) in runs.items():
            t0 = time.perf_counter()
            t.step((ids,), (ids,))
            times[name].append(time.perf_counter() - t0)
    for name, (_, _, n) in runs.items():
        ts = sorted(times[name])
        print(f"{name}: {n} rms_norm/swiglu nodes, median {1e3 * ts[len(ts) // 2]:.2f} ms/step, min {1e3 * ts[0]:.2f}")


if __name__ == "__main__":
    main()
