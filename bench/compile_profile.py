"""Where the time of compiling and building the 30-layer SmolLM2 step goes.

    PYTHONPATH=toolchain python bench/compile_profile.py [--layers 30] [--real] [--scheme lora|sparse|full]

Stages timed (program.compile_spec's, one by one): export (one torch.export in train mode
+ conversion + the derived inference graph; --export-twice: a second export in eval mode
instead of the derived graph, as before issue 35), lower (autodiff,
optimizer, DCE, fusion), lowp (frozen bf16), schedule, plan, Program (state
layout), emit (codegen rendering), g++ (model TUs, cold: POCK_CACHE_DIR is a
fresh folder unless --warm-runtime), load (dlopen + weights).  Without --real the
model is a random-init LlamaConfig of SmolLM2-135M's sizes (same graph).
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path


def smollm2_like(layers: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
                      num_attention_heads=9, num_key_value_heads=3, rms_norm_eps=1e-5, rope_theta=1e5,
                      tie_word_embeddings=True, max_position_embeddings=2048)
    return LlamaForCausalLM(cfg).float().train()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--real", action="store_true")
    ap.add_argument("--scheme", default="lora", choices=["lora", "sparse", "full"])
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--frozen", default="bf16")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--cprofile", default="", help="write a cProfile of the Python stages here")
    ap.add_argument("--warm-runtime", action="store_true", help="keep the default cache (runtime objects built)")
    ap.add_argument("--old-codegen", action="store_true",
                    help="as before chunking: the step in one function, the model TU at -O3 (for before/after)")
    ap.add_argument("--export-twice", action="store_true",
                    help="as before issue 35: the inference graph from a second, eval-mode export (for before/after)")
    args = ap.parse_args()
    options = None
    if args.old_codegen:
        from pockengine import codegen
        from pockengine.build import host
        options, host.MODEL_OPT = codegen.EmitOptions(chunk_nodes=10 ** 9), "-O3"
    if not args.warm_runtime:
        os.environ["POCK_CACHE_DIR"] = tempfile.mkdtemp(prefix="pock-prof-")
    import torch

    import pockengine as pe
    if args.export_twice:  # what program.export does for a model that branches on self.training
        from pockengine.passes import inference
        inference.reads_training = lambda model: ["--export-twice"]
    from pockengine.compiler import program as P
    from pockengine.ops import FULL
    from pockengine.frontends.torch_export import tied_aliases
    from pockengine.schemes.lora import apply_lora
    from pockengine.schemes.quant import check_frozen_dtype

    t0 = time.perf_counter()
    if args.real:
        from pockengine.demo_llm import load_smollm2
        _, model = load_smollm2()
    else:
        model = smollm2_like(args.layers)
    times = {"load model": time.perf_counter() - t0}
    x = torch.randint(0, 49152, (1, args.seq))
    y = torch.randint(0, 49152, (1, args.seq))
    prof = cProfile.Profile() if args.cprofile else None

    def stage(name, fn, *a):
        t, c = time.perf_counter(), time.process_time()
        if prof:
            prof.enable()
        r = fn(*a)
        if prof:
            prof.disable()
        times[name] = time.perf_counter() - t
        cpu = time.process_time() - c  # this process's CPU seconds (all threads): steadier than wall time under load
        print(f"  {name:10s} {times[name]:8.2f} s  (CPU {cpu:.2f} s)", flush=True)
        return r

    n = args.layers
    upd = "full" if args.scheme == "full" else "none"
    if args.scheme == "sparse":
        upd = {"model.norm.weight": 1.0}
        for i in range(n - 8, n):
            for p in ("self_attn.*", "mlp.gate_proj.*", "mlp.up_proj.*", "*layernorm*"):
                upd[f"model.layers.{i}.{p}"] = 1.0
    trained, _ = P.resolve_trained(model, upd)  # pe.compile's own resolution (program.compile_spec)
    adapters = {}
    if args.scheme == "lora":
        model, adapters = apply_lora(model, pe.LoRA(rank=8, alpha=16, targets=["*.q_proj", "*.v_proj"]))
        for m in adapters:
            trained[f"{m}.lora_A"] = trained[f"{m}.lora_B"] = FULL
    opt = pe.AdamW(lr=1e-3)
    graph, fwd = stage("export", P.export, model, (x,), (y,), "cross_entropy", "smollm2_prof", "logits", None)
    print(f"  nodes: train {len(graph.nodes)}, inference {len(fwd.nodes)}")
    stage("lower", P.lower, graph, fwd, trained, opt)
    lowp = check_frozen_dtype(args.frozen)
    if lowp != "f32":
        from pockengine.passes.lowp import store_frozen_lowp
        stage("lowp", store_frozen_lowp, [graph, fwd], trained, lowp)
    sched = stage("schedule", P.schedule_program, graph, fwd)
    plans = stage("plan", P.plan_program, graph, fwd, sched)
    prog = stage("Program", P.Program, "smollm2_prof", graph, fwd, opt, trained, tied_aliases(model), sched, plans)
    print(f"  nodes after lowering: step {len(prog.order)}, inference {len(prog.forward_order)}")
    source = stage("emit", P.emit, prog, None, None, options)
    print(f"  source: {len(source.text) / 1e6:.2f} MB, {source.text.count(chr(10))} lines")
    if prof:
        prof.dump_stats(args.cprofile)
        pstats.Stats(args.cprofile).sort_stats("cumulative").print_stats(40)
    if not args.no_build:
        from pockengine.build import host
        real_run, gxx = host._run, {}

        def timed_run(cmd, what):  # per-object compiler time (the model TU is the long one)
            t = time.perf_counter()
            real_run(cmd, what)
            gxx[Path(cmd[-3]).name] = time.perf_counter() - t
        host._run = timed_run
        trainer = stage("build", P.build, prog, source)
        host._run = real_run
        model_tu = next((v for k, v in gxx.items() if k.startswith("smollm2_prof")), 0.0)
        print(f"  g++ model TU {model_tu:.2f} s; runtime+kernels objects {sum(gxx.values()) - model_tu:.2f} s "
              f"(sum over {len(gxx)} commands, 2 at a time)")
        t = time.perf_counter()
        loss = trainer.step((x.numpy(),), (y.numpy(),))
        print(f"  first step {time.perf_counter() - t:.2f} s, loss {loss:.4f}")
    total = sum(v for k, v in times.items() if k != "load model")
    print(f"TOTAL compile+build {total:.1f} s (load model {times['load model']:.1f} s); stages: "
          + ", ".join(f"{k} {v:.1f}" for k, v in times.items()), flush=True)


if __name__ == "__main__":
    main()
