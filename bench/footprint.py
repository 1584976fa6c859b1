"""Training memory as the OS counts it (issue 36): bench/footprint.c, a plain C process linked
against one compiled model library, opens a checkpoint, trains N steps on random ids and
reports private dirty (/proc/self/smaps_rollup), RSS and peak RSS (VmHWM) and each step's loss.

    PYTHONPATH=toolchain .venv/bin/python bench/footprint.py [--setups smollm2:lora:256,...]
        [--steps 2] [--budgets none,floor] [--torch smollm2:256,smollm2:1024]
        [--out bench/footprint_results.md]   (also writes the .json beside it)

Setups (model:scheme:tokens): SmolLM2-135M or Qwen2.5-0.5B shapes (random init; the memory does
not depend on the values; FOOTPRINT_LAYERS=N: N decoder layers, a quicker proxy), LoRA r=8 on
q_proj/v_proj or bench/llm.py's sparse scheme, AdamW, batch 1, frozen_dtype="q4", one thread,
without a budget and at the smallest budget the compiler reaches (pe.compile's
memory_budget_mb; its PockError names it): the budgeted row's step time against the
unbudgeted one's, its losses and final weights compared bit for bit.  Then the PyTorch
baseline (the same LoRA, fp32, torch.utils.checkpoint per decoder layer, in its own process:
peak RSS, s/step).
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
INCLUDE = ROOT / "native" / "runtime" / "include"


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


LAYERS = int(os.environ.get("FOOTPRINT_LAYERS", "0"))  # > 0: that many decoder layers (a quicker proxy)


def smollm2_model(seed: int = 0):
    """SmolLM2-135M's shapes (HuggingFaceTB/SmolLM2-135M config; its 30 decoder layers, or
    FOOTPRINT_LAYERS), random init, as logits."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from pockengine.demo_llm import Logits
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=LAYERS or 30,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                      rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True)
    return Logits(LlamaForCausalLM(cfg).eval())


def qwen_model(seed: int = 0):
    """Qwen2.5-0.5B's shapes (Qwen/Qwen2.5-0.5B config: 24 layers, 896 wide, GQA 14/2, q/k/v
    biases, tied 151,936-word head), random init, as logits."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from pockengine.demo_llm import Logits
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=LAYERS or 24,
                      num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                      rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False)
    return Logits(Qwen2ForCausalLM(cfg).eval())


MODELS = {"smollm2": ("SmolLM2-135M", smollm2_model, 49152), "qwen": ("Qwen2.5-0.5B shapes", qwen_model, 151936)}


def scheme_kwargs(model: str, scheme: str, n_layers: int) -> dict:
    """pe.compile's keywords of a scheme: "lora" (r=8 on q_proj/v_proj, the issue's) or
    "sparse" (bench/llm.py's SmolLM2 scheme: attention, gate/up and norms of the last 8 blocks)."""
    import pockengine as pe
    if scheme == "lora":
        return dict(update="none", lora=pe.LoRA(rank=8, alpha=16, targets=["*.q_proj", "*.v_proj"]))
    if scheme == "sparse":
        return dict(update={f"m.model.layers.{i}.{p}": 1.0 for i in range(max(0, n_layers - 8), n_layers)
                            for p in ("self_attn.*", "mlp.gate_proj.*", "mlp.up_proj.*", "*layernorm*")})
    raise SystemExit(f"unknown scheme {scheme!r} (lora, sparse)")


def compile_row(model: str, scheme: str, seq: int, budget_mb=None, exports=None):
    """pe.compile of one row (q4 frozen, AdamW, batch 1); `exports` shares the export between
    a row's unbudgeted and budgeted compiles (program.compile_spec's cache)."""
    import torch
    import pockengine as pe
    from pockengine.compiler.program import CompileSpec, compile_spec
    _, build, _ = MODELS[model]
    m = exports.setdefault(("model", model), build()) if exports is not None else build()  # one copy in memory
    x = torch.zeros(1, seq, dtype=torch.int64)
    spec = CompileSpec(m, (x,), (x.clone(),), optimizer=pe.AdamW(lr=1e-4), frozen_dtype="q4",
                       name=f"{model}_{scheme}_fp_{seq}", memory_budget_mb=budget_mb,
                       **scheme_kwargs(model, scheme, m.m.config.num_hidden_layers))
    return compile_spec(spec, exports)


def compile_smollm2(seq: int, budget_mb=None):
    return compile_row("smollm2", "lora", seq, budget_mb)


def prepare_row(seq: int, budget_mb, work: Path, model: str = "smollm2", scheme: str = "lora", exports=None,
                prog=None) -> dict:
    """Compile (unless `prog` is given), build the library and its driver and write the initial
    checkpoint: {"driver", "ckpt", "final" (where a run saves its final state), "stats"...}."""
    from pockengine.runtime.checkpoint import write_initial_checkpoint
    import time
    t0 = time.perf_counter()
    prog = prog or compile_row(model, scheme, seq, budget_mb, exports)
    tag = f"{model}_{scheme}_{seq}_{'none' if budget_mb is None else 'budget_' + format(budget_mb, 'g')}"
    trainer = prog.build()
    compile_s = time.perf_counter() - t0
    ckpt = write_initial_checkpoint(prog, work / f"{tag}.pockckpt")
    driver = build_driver(trainer.lib_path, work / f"footprint_{tag}")
    trainer.close()
    st = prog.stats()
    stats = dict(arena_mib=st["arena_bytes"] / 2**20, state_mib=st["state_bytes"] / 2**20,
                 private_mib=st.get("private_bytes", st["arena_bytes"] + st["state_bytes"]) / 2**20,
                 mapped_mib=st.get("mapped_bytes", 0) / 2**20, recompute_flops=st.get("recompute_flops", 0),
                 flops_per_step=st["flops_per_step"], compile_build_s=round(compile_s, 1),
                 optimizer_state_mib=st["optimizer_state_bytes"] / 2**20)
    return {"driver": driver, "ckpt": ckpt, "final": work / f"{tag}.final.pockckpt", "vocab": MODELS[model][2],
            "stats": stats}


def run_row(prep: dict, steps: int) -> dict:
    """One run of a prepared row's driver: its report and the compiler's stats."""
    row = measure(prep["driver"], prep["ckpt"], steps, 1, prep["vocab"], save=prep["final"])
    row.update(prep["stats"], final=str(prep["final"]))
    return row


def median_runs(runs: list[dict]) -> dict:
    """The last run's report with the median step times of all runs (the memory is the same in each)."""
    import statistics
    row = dict(runs[-1])
    for k in ("ms_per_step", "cpu_ms_per_step"):
        if all(k in r for r in runs):
            row[k] = statistics.median(r[k] for r in runs)
            row[k + "_runs"] = [r[k] for r in runs]
    return row


def same_weights(a: Path, b: Path) -> bool:
    """Whether two saved checkpoints hold bit-identical tensors (by name)."""
    import numpy as np
    from pockengine.runtime.checkpoint import read_checkpoint
    x, y = read_checkpoint(a), read_checkpoint(b)
    return x.tensors.keys() == y.tensors.keys() and all(
        np.array_equal(x.tensors[k][1], y.tensors[k][1]) for k in x.tensors)


FLOOR = re.compile(r"smallest reachable private memory is ([0-9.]+) MiB")


def measure_rows(model: str, scheme: str, seq: int, steps: int, budgets: list, work: Path,
                 repeat: int = 1) -> list[tuple[str, dict]]:
    """The rows of one setup, one per budget ("none", "floor": the smallest reachable, which the
    PockError of a 1e-6 MiB budget names, or a number of MiB).  Every row is built first, then
    the drivers run A, B, A, B, ... `repeat` times (median step times: a loaded machine's drift
    falls on every row alike).  A budgeted row records its step time and losses against the
    unbudgeted one's and whether the final weights are bit-identical.  A row that fails to
    build or run is said on stderr and left out; the others go on."""
    label, _, _ = MODELS[model]
    what = f"{label} {'LoRA' if scheme == 'lora' else scheme} q4, {seq} tokens"
    exports, preps = {}, []
    for b in budgets:
        name = what
        try:
            name, budget, prog = budget_row(model, scheme, seq, b, what, exports)
            preps.append((name, budget, prepare_row(seq, budget, work, model, scheme, exports, prog), []))
            print(f"footprint: built {name}", file=sys.stderr, flush=True)
        except Exception as e:  # say so, keep going
            print(f"footprint: {name}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    for r in range(repeat):
        for name, _, prep, runs in preps:
            try:
                runs.append(run_row(prep, steps))
                print(f"footprint: run {r} {name}: {runs[-1]['ms_per_step']:.0f} ms, "
                      f"cpu {runs[-1].get('cpu_ms_per_step', 0):.0f} ms", file=sys.stderr, flush=True)
            except Exception as e:
                print(f"footprint: run {r} {name}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    rows, base = [], None
    for name, budget, prep, runs in preps:
        if runs:
            row = median_runs(runs)
            row.update(model=model, scheme=scheme, seq=seq, budget_mb=budget, repeat=repeat)
            if budget is None:
                base = row
            elif base is not None:
                compare(row, base, steps)
            rows.append((name, row))
            print(name, json.dumps(row), flush=True)
    for _, _, prep, _ in preps:  # after every comparison: a budgeted row reads the unbudgeted one's
        Path(prep["ckpt"]).unlink(missing_ok=True)
        Path(prep["final"]).unlink(missing_ok=True)
    for _, row in rows:
        row.pop("final", None)
    return rows


def budget_row(model: str, scheme: str, seq: int, b: str, what: str, exports: dict):
    """(row name, budget MiB or None, the compiled program or None) for one --budgets entry:
    "none", "floor" or a number; a budget below the floor is measured at the floor its
    PockError names (the program is then compiled by the row itself)."""
    import pockengine as pe
    if b == "none":
        return what, None, None
    try:
        budget = 1e-6 if b == "floor" else float(b)
        prog = compile_row(model, scheme, seq, budget, exports)
        if b == "floor":
            raise RuntimeError("a 1e-6 MiB budget was met")
        return f"{what}, budget {budget:g} MiB", budget, prog
    except pe.PockError as e:  # below the floor: measured at the floor the error names
        if not FLOOR.search(str(e)):
            raise
        budget = float(FLOOR.search(str(e)).group(1))
        print(f"footprint: {what}: {e}", file=sys.stderr, flush=True)
        return f"{what}, budget {budget:g} MiB (the floor)", budget, None


def compare(row: dict, base: dict, steps: int) -> None:
    """A budgeted row against the unbudgeted one: time, CPU time and FLOPs ratios, losses and
    final weights bit for bit."""
    row["time_vs_unbudgeted"] = row["ms_per_step"] / base["ms_per_step"]
    if "cpu_ms_per_step" in row and "cpu_ms_per_step" in base:
        row["cpu_vs_unbudgeted"] = row["cpu_ms_per_step"] / base["cpu_ms_per_step"]
    row["flops_vs_unbudgeted"] = row["flops_per_step"] / base["flops_per_step"]
    row["losses_identical"] = all(row[f"loss{s}"] == base[f"loss{s}"] for s in range(steps))
    row["weights_identical"] = same_weights(Path(base["final"]), Path(row["final"]))



_TORCH_CHILD = r"""
import json, sys, time, torch
import torch.utils.checkpoint as cp
sys.path.insert(0, sys.argv[3])
import footprint
import pockengine as pe
from pockengine.schemes.lora import apply_lora
torch.set_num_threads(1)
seq, steps, kind = int(sys.argv[1]), int(sys.argv[2]), sys.argv[4]
_, build, vocab = footprint.MODELS[kind]
model, _ = apply_lora(build(), pe.LoRA(rank=8, alpha=16, targets=["*.q_proj", "*.v_proj"]))
model.train()
for n, p in model.named_parameters():
    p.requires_grad_(n.endswith(("lora_A", "lora_B")))
llm = model.m.model
for layer in llm.layers:  # torch.utils.checkpoint per decoder layer
    layer._orig_forward = layer.forward
    layer.forward = (lambda f: lambda *a, **k: cp.checkpoint(f, *a, use_reentrant=False, **k))(layer._orig_forward)
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
g = torch.Generator().manual_seed(0)
ids = torch.randint(0, vocab, (1, seq), generator=g)
times = []
for s in range(steps):
    t0 = time.perf_counter()
    logits = model(ids)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids.reshape(-1))
    opt.zero_grad(); loss.backward(); opt.step()
    times.append(time.perf_counter() - t0)
ms = 1e3 * sum(times[1:]) / max(1, len(times) - 1)
# VmHWM, not ru_maxrss: that one keeps the forking parent's peak across exec
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(json.dumps({"hwm_kb": hwm, "ms_per_step": ms}))
"""


def torch_row(seq: int, steps: int, model: str = "smollm2") -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "toolchain"), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", _TORCH_CHILD, str(seq), str(steps), str(ROOT / "bench"), model],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def table(rows: list[tuple[str, dict]]) -> str:
    out = ["| setup | private dirty (MiB) | RSS (MiB) | peak RSS (MiB) | checkpoint clean (MiB) | "
           "compiler's private: arena + trained state (MiB) | s/step (CPU s) | vs unbudgeted: time (CPU), FLOPs | losses, weights |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for name, r in rows:
        mib = lambda k: f"{r[k] / 1024:.0f}" if k in r else "n/a"  # noqa: E731
        priv = (f"{r['private_mib']:.1f} ({r['private_mib'] - (r['state_mib'] - r['mapped_mib']):.1f} + "
                f"{r['state_mib'] - r['mapped_mib']:.1f})") if "arena_mib" in r else "-"
        vs = f"{r['time_vs_unbudgeted']:.2f}x" if "time_vs_unbudgeted" in r else "-"
        if "cpu_vs_unbudgeted" in r:
            vs += f" ({r['cpu_vs_unbudgeted']:.2f}x)"
        secs = f"{r['ms_per_step'] / 1e3:.1f}"
        if "cpu_ms_per_step" in r:
            secs += f" ({r['cpu_ms_per_step'] / 1e3:.1f})"
        if "time_vs_unbudgeted" in r and "flops_per_step" in r:
            vs += f", {r.get('flops_vs_unbudgeted', 1 + r['recompute_flops'] / (r['flops_per_step'] - r['recompute_flops'])):.2f}x"
        same = "-" if "losses_identical" not in r else (
            ("identical" if r["losses_identical"] else "DIFFER") + ", " +
            ("bit-identical" if r["weights_identical"] else "DIFFER"))
        out.append(f"| {name} | {mib('train_private_dirty_kb')} | {mib('train_rss_kb')} | "
                   f"{mib('train_hwm_kb') if 'train_hwm_kb' in r else mib('hwm_kb')} | {mib('train_ckpt_clean_kb')} | "
                   f"{priv} | {secs} | {vs} | {same} |")
    return "\n".join(out) + "\n"


# the targets (private dirty <= 64 / 160 / 128 MiB) as budgets, 2 MiB under for the runtime
SETUPS = "smollm2:lora:256:62,smollm2:lora:1024:158,qwen:lora:256:126,smollm2:sparse:256"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setups", default=SETUPS, help="comma-separated model:scheme:tokens (models: smollm2, qwen; "
                    "schemes: lora, sparse)")
    ap.add_argument("--seqs", default=None, help="shorthand: smollm2:lora at these token counts")
    ap.add_argument("--steps", type=int, default=2, help="training steps per run, >= 2: the first is untimed")
    ap.add_argument("--repeat", type=int, default=1, help="each setup's rows are built first, then their drivers "
                    "run interleaved this many times (median step times)")
    ap.add_argument("--budgets", default="none,floor", help="comma-separated: none, floor (the smallest reachable "
                    "budget, as the compiler's PockError names it) or MiB (memory_budget_mb); one below the floor "
                    "is measured at the floor")
    ap.add_argument("--torch", default="smollm2:256,smollm2:1024", help="PyTorch baseline rows, model:tokens "
                    "(LoRA, fp32, checkpoint per decoder layer); 'none' for none")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "bench" / "footprint_results.md"))
    ap.add_argument("--from-json", default=None, help="comma-separated result JSONs of earlier runs (e.g. run in "
                    "parallel): their rows, in that order, into --out (nothing measured)")
    args = ap.parse_args(argv)
    if args.steps < 2:  # footprint.c and the PyTorch child time the steps after the first
        ap.error(f"--steps must be at least 2, got {args.steps}: the first step is a warm-up that is not timed, "
                 "so with fewer there is no step time to report or compare against the unbudgeted row")
    if args.from_json:
        rows = [(r.pop("setup"), r) for f in args.from_json.split(",") for r in json.loads(Path(f).read_text())["rows"]]
        print(write(args, rows))
        return 0
    setups = [s.split(":") for s in (args.setups if args.seqs is None else
                                    ",".join(f"smollm2:lora:{n}" for n in args.seqs.split(","))).split(",") if s]
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for model, scheme, seq, *extra in setups:  # model:scheme:tokens[:MiB/MiB...]: budgets of this setup too
            budgets = args.budgets.split(",") + (extra[0].split("/") if extra else [])
            rows += measure_rows(model, scheme, int(seq), args.steps, budgets, Path(d), args.repeat)
            write(args, rows)
    for spec in ([] if args.no_torch or args.torch == "none" else args.torch.split(",")):
        model, seq = spec.split(":")
        name = f"PyTorch {MODELS[model][0]} LoRA fp32 + checkpoint per layer, {seq} tokens"
        try:
            r = torch_row(int(seq), args.steps, model)
            r.update(model=model, scheme="torch-lora", seq=int(seq))
            rows.append((name, r))
            print(name, json.dumps(r), flush=True)
            write(args, rows)
        except Exception as e:
            print(f"footprint: {name}: {e}", file=sys.stderr)
    print(write(args, rows))
    return 0


NOTES = """
- private dirty: Private_Dirty of /proc/self/smaps_rollup in the C process (bench/footprint.c) after
  the steps, what iOS jetsam and Android's low-memory killer charge; checkpoint clean: the frozen
  weights' pages, mapped from the checkpoint file and never copied.
- budget N MiB: pe.compile(..., memory_budget_mb=N); "(the floor)": the smallest the compiler
  reaches (every block recomputed from its input), as its PockError names it; the other budgets are
  the issue's targets (64 / 160 / 128 MiB) less 2 MiB for the runtime.
- vs unbudgeted: s/step against the row without a budget, measured one after the other (noisy on a
  loaded machine; with --repeat N the rows' drivers run interleaved N times, medians), in brackets the
  CPU time of the process (CLOCK_PROCESS_CPUTIME_ID: what a loaded machine's preemption leaves out),
  and the compiled step's FLOPs against the unbudgeted one's (exact); losses, weights: the budgeted
  run's per-step losses and final checkpoint compared bit for bit with the unbudgeted run's.
- PyTorch: the same LoRA in fp32 with torch.utils.checkpoint per decoder layer, one thread; peak RSS
  (VmHWM) of its own process.
"""


def write(args, rows) -> str:
    """The table (args.out) and the rows as JSON beside it; returns the table."""
    layers = f"{LAYERS} decoder layers (FOOTPRINT_LAYERS)" if LAYERS else "every decoder layer"
    text = (f"# Training memory (bench/footprint.py): one thread, batch 1, AdamW, frozen q4, random ids, "
            f"{args.steps} steps, {layers}\n\n" + table(rows) + NOTES)
    Path(args.out).write_text(text)
    Path(args.out).with_suffix(".json").write_text(json.dumps(
        {"steps": args.steps, "layers": LAYERS or "all", "rows": [{"setup": n, **r} for n, r in rows]}, indent=1) + "\n")
    return text


if __name__ == "__main__":
    sys.exit(main())
