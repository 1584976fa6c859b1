"""Arena and optimizer-state bytes of a GPT-style transformer LM (vocab 8000,
d_model 256, 4 layers, 4 heads, FFN 1024, seq 64) under full, sparse and
last-layer updates, with and without operator reordering, from prog.stats().

    .venv/bin/python bench/memory_report.py [batch ...]
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import pockengine as pe  # noqa: E402
from models import GPT  # noqa: E402

SPARSE = {f"blocks.{i}.{p}": 1.0 for i in (2, 3) for p in ("qkv.weight", "proj.*", "fc1.*", "ln1.*", "ln2.*")}
SPARSE["ln_f.*"] = 1.0
SCHEMES = {"full": "full", "sparse (PockEngine)": SPARSE, "last layer (tied head)": {"tok.weight": 1.0}}


def main(batches):
    torch.manual_seed(0)
    model = GPT(vocab=8000, d=256, layers=4, heads=4, seq=64)
    print("| batch | scheme | arena MiB | arena MiB without reordering | optimizer state MiB | GFLOP/step |")
    print("|---|---|---|---|---|---|")
    for b in batches:
        x, y = torch.randint(0, 8000, (b, 64)), torch.randint(0, 8000, (b, 64))
        for name, update in SCHEMES.items():
            # exact_skip=False: the reordered schedule (the default exact guard runs updates last)
            s = pe.compile(model, (x,), (y,), update=update, optimizer=pe.SGD(lr=0.01, momentum=0.9),
                           exact_skip=False).stats()
            print(f"| {b} | {name} | {s['arena_bytes'] / 2**20:.2f} | {s['arena_bytes_no_reorder'] / 2**20:.2f} | "
                  f"{s['optimizer_state_bytes'] / 2**20:.2f} | {s['flops_per_step'] / 1e9:.3f} |", flush=True)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1, 8])
