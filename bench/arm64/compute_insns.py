"""aarch64 instructions of one training step with fp32 against bf16 and fp16 compute, under qemu.

    nice -n 10 .venv/bin/python bench/arm64/compute_insns.py

A Llama with SmolLM2-135M's widths (hidden 576, MLP 1536, 9 heads / 3 KV heads, tied
embeddings; random init) cut to --layers blocks and a --vocab token table, one sequence of
--seq tokens, AdamW, in the schemes whose frozen linears compute_dtype changes:

  * sparse  attention, gate/up projections and norms of the last --trained blocks trained (the
            issue's SmolLM2 scheme); the earlier blocks, the down projections and the tied head frozen;
  * lora    LoRA r=8 on every q/v projection, every base weight frozen.

Each scheme is compiled once per --compute dtype (pe.compile(..., compute_dtype=...): the
frozen-weight products, forward and input gradient, in bf16 / fp16 with fp32 accumulation),
cross-compiled like bench/arm64/insns.py (-O3 -march=armv8.2-a+fp16+dotprod, statically linked
with tests/arm64/train_driver.c) and run under `qemu-aarch64 -cpu max` on one thread, which has
BF16 and fp16 arithmetic: bf16 takes BFMMLA (kernels/lowp_dot.cpp, chosen at run time from
HWCAP2_BF16) and fp16 FMLA .8h (kernels/lowp_fmla.cpp).  bench/arm64/insn_count.c counts

  * every instruction (per step = (count of 1 + K steps - count of 1 step) / K);
  * the instructions by the object file their code comes from (ranges from the linker map):
    the frozen products' kernels (lowp*.cpp), the fp32 GEMM (gemm/gemv/linear*.cpp), ...;
  * BFMMLA / BFDOT / FMLA .8h / FMLA .4s executed: which path ran (checked: bf16 executes
    BFMMLA, fp16 FMLA on fp16 vectors, fp32 neither).

The frozen products' share of the fp32 step is derived: fp32's count less the bf16 step's
count outside lowp*.cpp (the rest of the step is the same code on the same data).  Writes
bench/arm64/compute_results.md and .json (--out; bench/arm64/insns.py appends the .md to results.md);
--from-json FILE rewrites the .md from a saved .json without running anything.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import insns  # noqa: E402  (bench/arm64/insns.py: build, plugin, the tools; puts toolchain/ on sys.path)

import pockengine as pe  # noqa: E402

COMPUTE = ("fp32", "bf16", "fp16")
SCHEMES = ("sparse", "lora")
# object-file stems -> the group their instructions count to (the rest of the runtime: "other kernels")
GROUPS = {
    "frozen products (lowp*.cpp)": ("lowp", "lowp_dot", "lowp_fmla"),
    "fp32 GEMM (gemm, gemv, linear*.cpp)": ("gemm", "gemv", "linear", "linear_ce"),
    "attention, rope, softmax": ("attention", "rope", "softmax"),
    "norms, swiglu, elementwise": ("rms_norm", "layer_norm", "swiglu", "elementwise", "activation"),
    "optimizer": ("optimizer",),
    "generated step (model TU)": (),
}
OTHER_RT, OUTSIDE = "other runtime", "libc, start-up, the rest"
CLASS_NAMES = {"bfmmla": "BFMMLA", "bfdot": "BFDOT", "fmla_f16": "FMLA .8h/.4h", "fmla_f32": "FMLA .4s/.2s"}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compute", default="fp32,bf16,fp16", help="compute_dtypes to count (fp32 always first)")
    ap.add_argument("--schemes", default="sparse,lora")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--trained", type=int, default=2, help="sparse: the last N blocks are (partly) trained")
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--mlp", type=int, default=1536)
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=1, help="K: extra steps the per-step count is taken over")
    ap.add_argument("--cpu", default="max", help="qemu -cpu (max: BF16 and fp16 arithmetic)")
    ap.add_argument("--check-cpu", default="neoverse-n1",
                    help="also run the bf16 binary on this qemu CPU without BF16 (the run-time choice: the "
                         "portable path, no BFMMLA); '' skips it")
    ap.add_argument("--out", default=str(HERE))
    ap.add_argument("--from-json", metavar="FILE", help="no runs: rewrite the .md from a compute_results.json "
                                                         "(its own arguments)")
    a = ap.parse_args(argv)
    cds = ["fp32"] + [c for c in a.compute.split(",") if c and c != "fp32"]
    bad = [c for c in cds if c not in COMPUTE] + [s for s in a.schemes.split(",") if s not in SCHEMES]
    if bad:
        ap.error(f"unknown --compute / --schemes value(s): {', '.join(bad)} (compute: {', '.join(COMPUTE)}; "
                 f"schemes: {', '.join(SCHEMES)})")
    if not 0 < a.trained <= a.layers or a.hidden % a.heads or a.heads % a.kv_heads or min(a.seq, a.vocab, a.steps) < 1:
        ap.error("need 0 < --trained <= --layers, --heads dividing --hidden, --kv-heads dividing --heads, "
                 "and positive --seq, --vocab, --steps")
    a.compute = cds
    a.schemes = a.schemes.split(",")
    return a


def make_model(a):
    """(module(ids) -> logits, the sparse update) for the Llama of the arguments (seeded)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from pockengine.demo_llm import Logits
    torch.manual_seed(0)
    m = LlamaForCausalLM(LlamaConfig(
        vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.mlp, num_hidden_layers=a.layers,
        num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, rms_norm_eps=1e-5, rope_theta=1e5,
        max_position_embeddings=max(2048, a.seq), tie_word_embeddings=True)).float().train()
    sparse = {f"m.model.layers.{i}.{p}": 1.0 for i in range(a.layers - a.trained, a.layers)
              for p in ("self_attn.*", "mlp.gate_proj.*", "mlp.up_proj.*", "*layernorm*")}
    return Logits(m).train(), sparse


def compile_scheme(model, sparse, scheme: str, cd: str, x, y):
    kw = {"update": sparse} if scheme == "sparse" else {"update": "none", "lora": pe.LoRA(rank=8, alpha=16)}
    return pe.compile(model, (x,), (y,), optimizer=pe.AdamW(lr=1e-4), compute_dtype=cd,
                      name=f"compute_insns_{scheme}_{cd}", **kw)


def text_ranges(map_file: Path) -> list[tuple[int, int, str]]:
    """(start, end, object file) of every .text input section in a GNU ld map."""
    lines = map_file.read_text(errors="replace").splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith("Linker script and memory map")), 0)
    out = []
    sec = None
    for ln in lines[start:]:
        m = re.match(r"^ (\.text\S*)\s*(.*)$", ln)
        if m:
            sec, rest = m.group(1), m.group(2)
            if not rest:
                continue
        elif sec is not None:
            rest = ln
        else:
            continue
        cur, sec = sec, None
        f = re.match(r"^\s*0x([0-9a-f]+)\s+0x([0-9a-f]+)\s+(\S.*)$", rest)
        if cur and f and int(f.group(2), 16) > 0:
            out.append((int(f.group(1), 16), int(f.group(1), 16) + int(f.group(2), 16), f.group(3).strip()))
    return sorted(out)


def runtime_stems() -> list[str]:
    runtime = ROOT / "native" / "runtime"
    return sorted({p.stem for p in [*runtime.glob("*.cpp"), *(runtime / "kernels").glob("*.cpp")]})


def source_of(obj: str, stems) -> str:
    """The runtime source stem of an object file named in the map; "model" for the generated
    step, OUTSIDE for the rest (libc, libstdc++, crt, the driver)."""
    name = Path(obj).name
    if "(" in name or not name.endswith(".o"):  # an archive member (libc, libstdc++) or crt
        return OUTSIDE
    stem = re.sub(r"-[0-9a-f]{24}\.o$", "", name)
    return "model" if stem.startswith("model") else stem if stem in stems else OUTSIDE


def group_of(source: str) -> str:
    """The GROUPS key (or OTHER_RT / OUTSIDE) of a source_of() name."""
    if source == "model":
        return "generated step (model TU)"
    for g, stems in GROUPS.items():
        if source in stems:
            return g
    return OUTSIDE if source == OUTSIDE else OTHER_RT


def write_ranges(map_file: Path, out: Path, names: list[str]) -> None:
    """The plugin's ranges file, one group per source (names' index): adjacent sections merged."""
    stems = set(runtime_stems())
    merged = []
    for s, e, obj in text_ranges(map_file):
        g = names.index(source_of(obj, stems))
        if merged and merged[-1][2] == g and merged[-1][1] >= s:
            merged[-1][1] = max(merged[-1][1], e)
        elif merged and s < merged[-1][1]:
            continue  # overlapping (should not happen in a linked map): keep the first
        else:
            merged.append([s, e, g])
    out.write_text("".join(f"{s:x} {e:x} {g}\n" for s, e, g in merged))


def run_counts(exe: Path, plugin: Path, ranges: Path, work: Path, ckpt: Path, steps: int, cpu: str) -> dict:
    """{"insns": N, "group G": N, "class C": N, "losses": [...]} of `steps` steps from ckpt."""
    r = subprocess.run([insns.QEMU, "-cpu", cpu, "-plugin", f"{plugin},ranges={ranges},classes=1", "-d", "plugin",
                        str(exe), str(ckpt), str(work / "data.bin"), str(steps), str(work / "end.ckpt"), "1"],
                       capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(f"{exe.name} failed under qemu: {r.stderr[-2000:]}")
    got = {"losses": [float(ln.split()[1]) for ln in r.stdout.splitlines() if ln.startswith("loss ")]}
    for ln in (r.stderr + "\n" + r.stdout).replace("insns ", "\ninsns ").splitlines():
        p = ln.split()
        if len(p) == 2 and p[0] == "insns":
            got["insns"] = int(p[1])
        elif len(p) == 3 and p[0] in ("group", "class"):
            got[f"{p[0]} {p[1]}"] = int(p[2])
    if "insns" not in got or len(got["losses"]) != steps:
        raise RuntimeError(f"{exe.name}: no count or losses in qemu's output:\n{r.stdout[-1000:]}\n{r.stderr[-1000:]}")
    return got


def per_step(exe: Path, plugin: Path, work: Path, steps: int, cpu: str) -> dict:
    """run_counts' counts per step: (1 + steps steps - 1 step) / steps; "losses" those of the long run."""
    c1 = run_counts(exe, plugin, work / "ranges.txt", work, work / "start.ckpt", 1, cpu)
    ck = run_counts(exe, plugin, work / "ranges.txt", work, work / "start.ckpt", 1 + steps, cpu)
    return {**{key: (ck.get(key, 0) - c1.get(key, 0)) / steps for key in set(c1) | set(ck) if key != "losses"},
            "losses": ck["losses"]}


def measure(a) -> list[dict]:
    names = [*runtime_stems(), "model", OUTSIDE]
    model, sparse = make_model(a)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, a.vocab, (1, a.seq + 1), generator=g)
    x, y = tokens[:, :-1], tokens[:, 1:]
    rows = []
    with tempfile.TemporaryDirectory(prefix="pock-compute-insns-") as tmp:
        tmp = Path(tmp)
        plugin = insns.plugin(tmp)
        for scheme in a.schemes:
            row = {"scheme": scheme, "compute": {}}
            for cd in a.compute:
                t0 = time.perf_counter()
                work = tmp / f"{scheme}-{cd}"
                work.mkdir()
                prog = compile_scheme(model, sparse, scheme, cd, x, y)
                (work / f"model-{cd}.cpp").write_text(prog.source())
                host = prog.build()
                host.save(work / "start.ckpt")
                with open(work / "data.bin", "wb") as f:
                    for _ in range(1 + a.steps):
                        for t, io in zip([x, y], host.inputs + host.targets):
                            f.write(np.ascontiguousarray(t.numpy(), dtype=io.dtype).tobytes())
                exe = insns.build(work / f"model-{cd}.cpp", ROOT / "native" / "runtime", (), work / "train",
                                  link=(f"-Wl,-Map={work / 'train.map'}",))
                write_ranges(work / "train.map", work / "ranges.txt", names)
                d = per_step(exe, plugin, work, a.steps, a.cpu)
                st = prog.stats()
                sources = {n: d.get(f"group {i}", 0.0) for i, n in enumerate(names)}
                groups = dict.fromkeys([*GROUPS, OTHER_RT, OUTSIDE], 0.0)
                for n, v in sources.items():
                    groups[group_of(n)] += v
                row["compute"][cd] = {
                    "insns": d["insns"], "groups": groups, "sources": {n: v for n, v in sources.items() if v},
                    "classes": {c: d.get(f"class {c}", 0.0) for c in CLASS_NAMES},
                    "losses": d["losses"], "flops_per_step": st["flops_per_step"],
                    "frozen_products": sum(1 for n in prog.graph.nodes if n.attrs.get("compute") in ("bf16", "f16")),
                    "trained_params": st["trainable_elements"], "state_bytes": st["state_bytes"]}
                if cd == "bf16" and a.check_cpu:  # the same binary on a core without BF16
                    o = per_step(exe, plugin, work, a.steps, a.check_cpu)
                    row["compute"][cd]["check_cpu"] = {"cpu": a.check_cpu, "insns": o["insns"],
                                                       "classes": {c: o.get(f"class {c}", 0.0) for c in CLASS_NAMES},
                                                       "losses": o["losses"]}
                    print(f"{scheme} compute bf16 on -cpu {a.check_cpu}: {o['insns'] / 1e6:.1f} M instructions/step, "
                          f"BFMMLA {o.get('class bfmmla', 0.0) / 1e6:.2f} M", flush=True)
                print(f"{scheme} compute {cd}: {d['insns'] / 1e6:.1f} M instructions/step, lowp*.cpp "
                      f"{groups[next(iter(GROUPS))] / 1e6:.1f} M; " +
                      ", ".join(f"{CLASS_NAMES[c]} {v / 1e6:.2f} M" for c, v in row["compute"][cd]["classes"].items())
                      + f" [{time.perf_counter() - t0:.0f} s]", flush=True)
            rows.append(row)
    return rows


def check_paths(rows: list[dict], cpu: str = "max") -> list[str]:
    """The arithmetic each compute dtype ran on, judged from the executed instructions (M a step);
    raises when a dtype did not take its path: on -cpu max bf16 without BFMMLA, fp16 without fp16
    FMLA, fp32 with either; bf16 with BFMMLA on the --check-cpu core (no BF16)."""
    notes = []
    for r in rows:
        for cd, v in r["compute"].items():
            c = v["classes"]
            want = {"fp32": c["bfmmla"] == 0 and c["fmla_f16"] == 0, "bf16": c["bfmmla"] > 0,
                    "fp16": c["fmla_f16"] > 0 and c["bfmmla"] == 0}[cd]
            if cpu == "max" and not want:
                raise RuntimeError(f"{r['scheme']} {cd}: not the expected path (instructions executed per step: {c})")
            notes.append(f"{r['scheme']} {cd} on -cpu {cpu}: " +
                         ", ".join(f"{CLASS_NAMES[k]} {c[k] / 1e6:.2f}" for k in ("bfmmla", "fmla_f16", "fmla_f32")))
            other = v.get("check_cpu")
            if other and other["classes"]["bfmmla"] != 0:
                raise RuntimeError(f"{r['scheme']} bf16 ran BFMMLA on -cpu {other['cpu']}, a core without BF16")
            if other:
                notes.append(f"{r['scheme']} bf16, the same binary on -cpu {other['cpu']} (no BF16): no BFMMLA, "
                             f"FMLA .4s {other['classes']['fmla_f32'] / 1e6:.2f}; {other['insns'] / 1e6:.1f} M "
                             f"instructions a step ({other['insns'] / r['compute']['fp32']['insns']:.2f}x fp32's): "
                             "the portable path (fp32 GEMM over the rounded operands)")
    return notes


def derive(rows: list[dict]) -> None:
    """groups[OUTSIDE]: what the other groups leave of the count (libc, start-up, and code outside
    every .text section: the static binary's .iplt stubs to libc's memset/memcpy);
    row["frozen_products_fp32"]: fp32's count less the rest of the step (a lowp dtype's count
    outside lowp*.cpp, the smaller one); nan with fp32 alone."""
    low = next(iter(GROUPS))
    for r in rows:
        c = r["compute"]
        for v in c.values():
            v["groups"][OUTSIDE] = v["insns"] - sum(n for g, n in v["groups"].items() if g != OUTSIDE)
        rest = [v["insns"] - v["groups"][low] for cd, v in c.items() if cd != "fp32"]
        r["frozen_products_fp32"] = c["fp32"]["insns"] - min(rest) if rest else float("nan")


def report(rows: list[dict], a) -> str:
    cds = a.compute
    lines = ["# aarch64 instructions per training step: fp32 against bf16 and fp16 compute", "",
             "Reproduce (about 20 minutes on a loaded 2-core x86 machine: six cross-compiled steps, each run "
             "under qemu for 1 and 2 steps, bf16's also on a core without BF16; `--from-json` rewrites this "
             "file from compute_results.json):", "",
             "    nice -n 10 .venv/bin/python bench/arm64/compute_insns.py", "",
             f"A Llama with SmolLM2-135M's widths (hidden {a.hidden}, MLP {a.mlp}, {a.heads} heads / {a.kv_heads} KV "
             f"heads, tied embeddings) cut to {a.layers} blocks and a {a.vocab}-token table; one sequence of {a.seq} "
             f"tokens, AdamW. sparse: attention, gate/up and norms of the last {a.trained} blocks trained (the "
             "earlier blocks, the down projections and the head frozen); lora: r=8 on every q/v, every base "
             f"weight frozen. `pe.compile(..., compute_dtype=...)`; qemu-aarch64 -cpu {a.cpu}, one thread, "
             f"{' '.join(insns.FLAGS[:2])}; per step = (count of {1 + a.steps} steps - count of 1) / {a.steps}. "
             "bf16 runs on BFMMLA (chosen at run time from HWCAP2_BF16), fp16 on FMLA .8h; fp32's frozen "
             "products are FMLA .4s over fp32 weights. Fewer is better.", "",
             "| scheme | MFLOP/step | " + " | ".join(f"{cd} (M insns)" for cd in cds) + " | " +
             " | ".join(f"{cd} / fp32" for cd in cds[1:]) + " | frozen products in fp32 (M insns, share) | " +
             " | ".join(f"frozen products {cd} / fp32" for cd in cds[1:]) + " |",
             "|---|---:|" + "---:|" * (2 * len(cds) - 1) + "---:|" + "---:|" * (len(cds) - 1)]
    low = next(iter(GROUPS))
    summary = []
    for r in rows:
        c = r["compute"]
        f32, frozen32 = c["fp32"]["insns"], r["frozen_products_fp32"]
        rest = f32 - frozen32
        summary.append(f"- {r['scheme']}: the frozen products take {frozen32 / 1e6:.0f} M of fp32's {f32 / 1e6:.0f} M "
                       f"instructions a step ({frozen32 / f32:.0%}); " +
                       "; ".join(f"{cd} does them in {c[cd]['groups'][low] / 1e6:.0f} M "
                                 f"({c[cd]['groups'][low] / frozen32:.2f}x), the step {c[cd]['insns'] / f32:.2f}x"
                                 for cd in cds[1:]) +
                       f". The rest of the step ({rest / 1e6:.0f} M: the trained products in fp32, attention, norms, "
                       f"loss, optimizer) is the same in every dtype, so no compute dtype can take the step below "
                       f"{rest / f32:.2f}x fp32's.")
        lines.append(f"| {r['scheme']} | {c['fp32']['flops_per_step'] / 1e6:.0f} | " +
                     " | ".join(f"{c[cd]['insns'] / 1e6:.1f}" for cd in cds) + " | " +
                     " | ".join(f"{c[cd]['insns'] / f32:.2f}x" for cd in cds[1:]) +
                     f" | {frozen32 / 1e6:.1f} ({frozen32 / f32:.0%}) | " +
                     " | ".join(f"{c[cd]['groups'][low] / frozen32:.2f}x" for cd in cds[1:]) + " |")
    lines += ["", *summary]
    lines += ["", "Instructions by where their code lives (M a step; exclusive: a kernel's calls into libc, e.g. "
              "lowp.cpp's memset of its padded operand buffers, count to libc), and the arithmetic executed (M "
              "instructions a step). Counts are exact for the single-threaded guest; two runs of the same "
              "binary differ by about 0.1 M a step (the thread pool's start-up):", "",
              "| scheme | compute | " + " | ".join(r_ for r_ in rows[0]["compute"]["fp32"]["groups"]) + " | " +
              " | ".join(CLASS_NAMES.values()) + " | loss after the last step |",
              "|---|---|" + "---:|" * (len(rows[0]["compute"]["fp32"]["groups"]) + len(CLASS_NAMES) + 1)]
    for r in rows:
        for cd in cds:
            v = r["compute"][cd]
            lines.append(f"| {r['scheme']} | {cd} | " + " | ".join(f"{n / 1e6:.1f}" for n in v["groups"].values())
                         + " | " + " | ".join(f"{n / 1e6:.2f}" for n in v["classes"].values()) +
                         f" | {v['losses'][-1]:.5f} |")
    lines += ["", "Which path ran: the arithmetic instructions executed (M a step). bf16's BFMMLA path is chosen "
              "at run time from HWCAP2_BF16; fp16's FMLA at compile time here (the +fp16 target; a baseline "
              "armv8-a build chooses it from HWCAP_ASIMDHP, tests/arm64/test_lowp_fmla.py):", "",
              *[f"- {n}" for n in check_paths(rows, a.cpu)], "",
              "The frozen products' share of the fp32 step is derived: fp32's count less the bf16/fp16 "
              "step's count outside lowp*.cpp (the rest of the step runs the same code on the same data; "
              "the smaller of the two). 'frozen products cd / fp32' compares lowp*.cpp's instructions "
              "(packing and rounding of both operands included) with that share; bench/arm64/lowp_cd_results.md "
              "has the same per product."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    a = parse_args(argv)
    missing = [t for t in (insns.CXX, insns.CC, insns.QEMU, "gcc") if shutil.which(t) is None]
    if missing and not a.from_json:
        print(f"missing: {', '.join(missing)}", file=sys.stderr)
        return 2
    out = Path(a.out)
    if a.from_json:
        saved = json.loads(Path(a.from_json).read_text())
        vars(a).update(saved["args"])
        rows = saved["rows"]
        derive(rows)
    else:
        rows = measure(a)
        derive(rows)
        out.mkdir(parents=True, exist_ok=True)
        (out / "compute_results.json").write_text(json.dumps(
            {"args": {k: v for k, v in vars(a).items() if k not in ("out", "from_json")}, "rows": rows}, indent=1))
    text = report(rows, a)  # raises when a dtype did not take its path (the counts are in the .json)
    (out / "compute_results.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
