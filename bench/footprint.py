"""Training memory as the OS counts it (issue 36): bench/footprint.c, a plain C process linked
against one compiled model library, opens a checkpoint, trains N steps on random ids and
reports private dirty (/proc/self/smaps_rollup), RSS and peak RSS (VmHWM).

    PYTHONPATH=toolchain .venv/bin/python bench/footprint.py [--seqs 256,1024] [--steps 3]
        [--budgets none,64] [--out bench/footprint.md] [--no-torch]

Rows: SmolLM2-135M shapes (random init; the memory does not depend on the values), LoRA r=8
on q_proj/v_proj, AdamW, batch 1, frozen_dtype="q4", one thread, per sequence length, with and
without pe.compile's memory_budget_mb (where this tree has it); then the PyTorch baseline (the
same LoRA, fp32, torch.utils.checkpoint per decoder layer, in its own process: peak RSS, ms/step).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DRIVER = ROOT / "bench" / "footprint.c"
INCLUDE = ROOT / "codegen" / "runtime" / "include"


def build_driver(lib: Path, out: Path) -> Path:
    """bench/footprint.c linked against the model library `lib` (found at run time by rpath)."""
    lib = Path(lib).resolve()
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-O2", "-std=c11", "-I", str(INCLUDE), str(DRIVER), str(lib), f"-Wl,-rpath,{lib.parent}",
                    "-o", str(out)], check=True)
    return out


def measure(driver: Path, ckpt: Path, steps: int, threads: int = 1, id_range: int = 64, save=None) -> dict:
    """The driver's report: {key: number} (private_dirty_kb, rss_kb, hwm_kb, ckpt_* for "open_"
    and "train_", ms_per_step)."""
    cmd = [str(driver), str(ckpt), str(steps), str(threads), str(id_range)] + ([str(save)] if save else [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"footprint driver failed ({r.returncode}): {r.stderr.strip()}")
    return {k: float(v) for k, v in (kv.split("=") for kv in r.stdout.split())}


LAYERS = int(os.environ.get("FOOTPRINT_LAYERS", "30"))  # fewer: a quicker proxy (memory per layer is the same)


def smollm2_model(seed: int = 0):
    """SmolLM2-135M's shapes (HuggingFaceTB/SmolLM2-135M config; FOOTPRINT_LAYERS decoder
    layers, default its 30), random init, as logits."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from pockengine.demo_llm import Logits
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=LAYERS,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                      rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True)
    return Logits(LlamaForCausalLM(cfg).eval())


def compile_smollm2(seq: int, budget_mb=None):
    import torch
    import pockengine as pe
    x = torch.zeros(1, seq, dtype=torch.int64)
    kw = dict(update="none", lora=pe.LoRA(rank=8, alpha=16, targets=["*.q_proj", "*.v_proj"]),
              optimizer=pe.AdamW(lr=1e-4), frozen_dtype="q4", name=f"smollm2_fp_{seq}")
    if budget_mb is not None:
        kw["memory_budget_mb"] = budget_mb
    return pe.compile(smollm2_model(), (x,), (x.clone(),), **kw)


def pockengine_row(seq: int, steps: int, budget_mb, work: Path) -> dict:
    from pockengine.checkpoint import write_initial_checkpoint
    prog = compile_smollm2(seq, budget_mb)
    trainer = prog.build()
    ckpt = write_initial_checkpoint(prog, work / f"smollm2_{seq}.pockckpt")
    driver = build_driver(trainer.lib_path, work / f"footprint_{seq}")
    trainer.close()
    st = prog.stats()
    row = measure(driver, ckpt, steps, 1, 49152)
    row.update(arena_mib=st["arena_bytes"] / 2**20, state_mib=st["state_bytes"] / 2**20,
               private_mib=st.get("private_bytes", st["arena_bytes"] + st["state_bytes"]) / 2**20,
               mapped_mib=st.get("mapped_bytes", 0) / 2**20, recompute_flops=st.get("recompute_flops", 0))
    return row


_TORCH_CHILD = r"""
import json, resource, sys, time, torch
import torch.utils.checkpoint as cp
sys.path.insert(0, sys.argv[3])
from footprint import smollm2_model
import pockengine as pe
from pockengine.lora import apply_lora
torch.set_num_threads(1)
seq, steps = int(sys.argv[1]), int(sys.argv[2])
model, _ = apply_lora(smollm2_model(), pe.LoRA(rank=8, alpha=16, targets=["*.q_proj", "*.v_proj"]))
model.train()
for n, p in model.named_parameters():
    p.requires_grad_(n.endswith(("lora_A", "lora_B")))
llama = model.m.model
for layer in llama.layers:  # torch.utils.checkpoint per decoder layer
    layer._orig_forward = layer.forward
    layer.forward = (lambda f: lambda *a, **k: cp.checkpoint(f, *a, use_reentrant=False, **k))(layer._orig_forward)
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
g = torch.Generator().manual_seed(0)
ids = torch.randint(0, 49152, (1, seq), generator=g)
times = []
for s in range(steps):
    t0 = time.perf_counter()
    logits = model(ids)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids.reshape(-1))
    opt.zero_grad(); loss.backward(); opt.step()
    times.append(time.perf_counter() - t0)
ms = 1e3 * sum(times[1:]) / max(1, len(times) - 1)
print(json.dumps({"hwm_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "ms_per_step": ms}))
"""


def torch_row(seq: int, steps: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "toolchain"), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", _TORCH_CHILD, str(seq), str(steps), str(ROOT / "bench")],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def table(rows: list[tuple[str, dict]]) -> str:
    out = ["| setup | private dirty (MiB) | RSS (MiB) | peak RSS (MiB) | checkpoint clean (MiB) | "
           "compiler's private (arena + state) MiB | ms/step |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in rows:
        mib = lambda k: f"{r[k] / 1024:.0f}" if k in r else "n/a"  # noqa: E731
        priv = f"{r['private_mib']:.0f} ({r['arena_mib']:.0f} + {r['state_mib']:.0f})" if "arena_mib" in r else "n/a"
        out.append(f"| {name} | {mib('train_private_dirty_kb')} | {mib('train_rss_kb')} | "
                   f"{mib('train_hwm_kb') if 'train_hwm_kb' in r else mib('hwm_kb')} | {mib('train_ckpt_clean_kb')} | "
                   f"{priv} | {r['ms_per_step']:.0f} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqs", default="256,1024")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--budgets", default="none", help="comma-separated MiB or 'none' (memory_budget_mb); one "
                    "below the floor is measured at the floor the compiler names")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "bench" / "footprint.md"))
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for seq in (int(s) for s in args.seqs.split(",")):
            for b in args.budgets.split(","):
                budget = None if b == "none" else float(b)
                name = f"SmolLM2-135M LoRA q4, {seq} tokens" + ("" if budget is None else f", budget {b} MiB")
                try:
                    try:
                        rows.append((name, pockengine_row(seq, args.steps, budget, Path(d))))
                    except ValueError as e:  # pe.PockError: a budget below the floor names the floor
                        m = re.search(r"smallest reachable private memory is ([0-9.]+) MiB", str(e))
                        if not m:
                            raise
                        print(f"footprint: {name}: {e}", file=sys.stderr, flush=True)
                        name = f"SmolLM2-135M LoRA q4, {seq} tokens, budget {m.group(1)} MiB (the floor)"
                        rows.append((name, pockengine_row(seq, args.steps, float(m.group(1)), Path(d))))
                except Exception as e:  # e.g. a tree without memory_budget_mb: say so, keep going
                    print(f"footprint: {name}: {e}", file=sys.stderr)
                print(name, json.dumps(rows[-1][1]) if rows and rows[-1][0] == name else "failed", flush=True)
            if not args.no_torch:
                name = f"PyTorch LoRA fp32 + checkpoint per layer, {seq} tokens"
                try:
                    rows.append((name, torch_row(seq, args.steps)))
                    print(name, json.dumps(rows[-1][1]), flush=True)
                except Exception as e:
                    print(f"footprint: {name}: {e}", file=sys.stderr)
    text = (f"# Training memory (bench/footprint.py): one thread, batch 1, AdamW, {LAYERS} decoder layers\n\n"
            + table(rows))
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
