"""Tokenizer throughput: pe.Tokenizer (the runtime's C++ tokenizer, one thread) against
Hugging Face `tokenizers` (Rust, one thread) on the SmolLM2 tokenizer, over Debian's
common-licenses and this repo's Python sources, with a cold and a warm piece cache.

    PYTHONPATH=toolchain .venv/bin/python bench/tokenizer.py
"""
import glob
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def text() -> str:
    files = sorted(glob.glob("/usr/share/common-licenses/*")) + sorted(glob.glob(str(ROOT / "toolchain/pockengine/**/*.py"),
                                                                              recursive=True))
    return "".join(Path(f).read_text(errors="replace") for f in files if os.path.isfile(f))


def best(fn, reps=3) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers loads: Hugging Face on one thread too
    import pockengine as pe
    from pockengine.demo_llm import smollm2_dir
    gguf = smollm2_dir()
    data = text()
    raw = data.encode()
    cold = pe.Tokenizer.from_pretrained(gguf)
    t0 = time.perf_counter()
    ids = cold.encode(raw)
    t_cold = time.perf_counter() - t0
    t_warm = best(lambda: cold.encode(raw))
    t_dec = best(lambda: cold.decode(ids))
    rows = [("pe.Tokenizer encode (cold cache)", len(raw) / t_cold / 1e6),
            ("pe.Tokenizer encode (warm cache)", len(raw) / t_warm / 1e6),
            ("pe.Tokenizer decode", len(raw) / t_dec / 1e6)]
    try:
        from transformers import AutoTokenizer
        hf = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).backend_tokenizer
        hf_ids = hf.encode(data).ids
        assert hf_ids == ids, "ids differ from Hugging Face's"
        rows.append(("HF tokenizers encode", len(raw) / best(lambda: hf.encode(data)) / 1e6))
    except ImportError:
        pass
    print(f"SmolLM2 tokenizer, {len(raw) / 1e6:.2f} MB of text, {len(ids)} ids, one thread")
    print("| what | MB/s |\n|---|---|")
    for name, mbs in rows:
        print(f"| {name} | {mbs:.2f} |")


if __name__ == "__main__":
    main()
