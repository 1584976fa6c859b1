"""Share of a SmolLM2-sized LoRA step (random-init Llama of SmolLM2-135M's sizes, 30 layers,
1 x 128 tokens, r=8 on q_proj/v_proj, one thread) spent in attention: sdpa and rope forward and
backward, plus the layout copies (permute/expand/sum_to) of the attention modules, from the
compiled step's profiler (3 profiled steps after one warm-up).  Compile + build is cold the first
time (minutes).

    PYTHONPATH=toolchain .venv/bin/python bench/attention_share.py
"""
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import llm  # noqa: E402
import pockengine as pe  # noqa: E402

ATTENTION = ("sdpa", "sdpa_bwd", "rope", "rope_bwd")
COPIES = ("permute", "expand", "sum_to")


def main():
    model, _, targets, vocab = llm.build_model("llama")
    data = llm.batches(vocab, 2)
    t0 = time.time()
    prog = pe.compile(model, *data[0], optimizer=pe.AdamW(lr=1e-4), name="llm_attention_share", update="none",
                      lora=pe.LoRA(rank=8, alpha=16, targets=targets))
    trainer = prog.build()
    print(f"compile + build {time.time() - t0:.0f} s", file=sys.stderr)
    trainer.set_num_threads(1)
    prof = trainer.profile(*data[0], steps=3, warmup=1)
    total = sum(r["ms"] for r in prof)
    att = sum(r["ms"] for r in prof if r["op"] in ATTENTION)
    cp = sum(r["ms"] for r in prof if r["op"] in COPIES and "self_attn" in (r["module"] or ""))
    print(f"step {prof.step_ms:.1f} ms; sdpa+rope fwd+bwd {att:.1f} ms ({100 * att / total:.1f}%), "
          f"attention layout copies {cp:.1f} ms ({100 * cp / total:.1f}%)")


if __name__ == "__main__":
    main()
