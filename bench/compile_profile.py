"""Where the time of compiling and building the 30-layer SmolLM2 step goes.

    PYTHONPATH=toolchain python bench/compile_profile.py [--layers 30] [--real] [--scheme lora|sparse|full]

The one compile path, timed stage by stage: program.compile_spec(spec, timings=...) stores
each of its stages' wall and CPU seconds: check, export (one torch.export in train mode +
conversion + the derived inference graph; --export-twice: a second export in eval mode
instead of the derived graph, as before issue 35), lower (autodiff, optimizer, DCE, fusion),
lowp (frozen bf16), schedule, plan, Program (state layout); then emit (codegen rendering) and
build (program.build(..., timings=...): each g++ object's seconds; cold: POCK_CACHE_DIR is a
fresh folder unless --warm-runtime; + dlopen and weights).  Without --real the model is a
random-init LlamaConfig of SmolLM2-135M's sizes (same graph).
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import tempfile
import time


def smollm2_like(layers: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
                      num_attention_heads=9, num_key_value_heads=3, rms_norm_eps=1e-5, rope_theta=1e5,
                      tie_word_embeddings=True, max_position_embeddings=2048)
    return LlamaForCausalLM(cfg).float().train()


def reads_training(model):
    """`model` as an instance of a subclass whose forward reads self.training: program.export
    exports such a model twice (train and eval mode), as it did every model before issue 35."""
    base = type(model)

    class ReadsTraining(base):
        def forward(self, *args, **kwargs):
            _ = self.training  # a read of `training` (what passes/inference.reads_training looks for)
            return base.forward(self, *args, **kwargs)
    model.__class__ = ReadsTraining
    return model


class Printed(dict):
    """compile_spec's timings, each stage printed as it ends."""

    def __setitem__(self, name, seconds):
        wall, cpu = seconds
        print(f"  {name:10s} {wall:8.2f} s  (CPU {cpu:.2f} s)", flush=True)  # CPU: steadier than wall under load
        super().__setitem__(name, seconds)


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
    if not args.warm_runtime:
        os.environ["POCK_CACHE_DIR"] = tempfile.mkdtemp(prefix="pock-prof-")
    import torch

    import pockengine as pe
    from pockengine import codegen
    from pockengine.build.host import MODEL_OPT
    from pockengine.compiler import program as P
    options, model_opt = (codegen.EmitOptions(chunk_nodes=10 ** 9), "-O3") if args.old_codegen else (None, MODEL_OPT)

    t0 = time.perf_counter()
    if args.real:
        from pockengine.demo_llm import load_smollm2
        _, model = load_smollm2()
    else:
        model = smollm2_like(args.layers)
    if args.export_twice:
        model = reads_training(model)
    load_s = time.perf_counter() - t0
    x = torch.randint(0, 49152, (1, args.seq))
    y = torch.randint(0, 49152, (1, args.seq))
    prof = cProfile.Profile() if args.cprofile else None

    n = args.layers
    spec = P.CompileSpec(model, (x,), (y,), optimizer=pe.AdamW(lr=1e-3), name="smollm2_prof", output="logits",
                         frozen_dtype=args.frozen, update="full" if args.scheme == "full" else "none")
    if args.scheme == "lora":
        spec = spec.replace(lora=pe.LoRA(rank=8, alpha=16, targets=["*.q_proj", "*.v_proj"]))
    if args.scheme == "sparse":
        upd = {"model.norm.weight": 1.0}
        for i in range(max(0, n - 8), n):  # the last 8 layers
            for p in ("self_attn.*", "mlp.gate_proj.*", "mlp.up_proj.*", "*layernorm*"):
                upd[f"model.layers.{i}.{p}"] = 1.0
        spec = spec.replace(update=upd)
    times = Printed()
    if prof:
        prof.enable()
    prog = P.compile_spec(spec, timings=times)
    print(f"  nodes after lowering: step {len(prog.order)}, inference {len(prog.forward_order)}")
    t, c = time.perf_counter(), time.process_time()
    source = prog.emit(options=options)
    times["emit"] = (time.perf_counter() - t, time.process_time() - c)
    if prof:
        prof.disable()
    print(f"  source: {len(source.text) / 1e6:.2f} MB, {source.text.count(chr(10))} lines")
    if prof:
        prof.dump_stats(args.cprofile)
        pstats.Stats(args.cprofile).sort_stats("cumulative").print_stats(40)
    if not args.no_build:
        gxx = {}  # per-object compiler seconds (the model TU is the long one)
        t, c = time.perf_counter(), time.process_time()
        trainer = P.build(prog, source, model_opt=model_opt, timings=gxx)
        times["build"] = (time.perf_counter() - t, time.process_time() - c)
        model_tu = sum(v for k, v in gxx.items() if k.startswith("smollm2_prof"))
        print(f"  g++ model TU {model_tu:.2f} s at {model_opt}; runtime+kernels objects "
              f"{sum(gxx.values()) - model_tu:.2f} s (sum over {len(gxx)} commands, run in parallel)")
        t = time.perf_counter()
        loss = trainer.step((x.numpy(),), (y.numpy(),))
        print(f"  first step {time.perf_counter() - t:.2f} s, loss {loss:.4f}")
    total = sum(wall for wall, _ in times.values())
    print(f"TOTAL compile+build {total:.1f} s (load model {load_s:.1f} s); stages: "
          + ", ".join(f"{k} {wall:.1f}" for k, (wall, _) in times.items()), flush=True)


if __name__ == "__main__":
    main()
