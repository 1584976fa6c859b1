"""`bench/run.py --quick` (the harness behind `make bench`): runs end to end in under a minute and
writes a results table with one sane row per (model, scheme, framework)."""
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bench_module(name):
    """bench/<name>.py under a unique module name (tests/models.py is also called `models`)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(f"pock_bench_{name}", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return module


workloads = _bench_module("models").workloads


def _cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    t0 = time.time()
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), "--quick", "--out", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=str(ROOT))
    elapsed = time.time() - t0
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out, elapsed, r.stdout


def test_progress_is_shown(quick_run):
    _, _, stdout = quick_run
    assert "prepare [" in stdout and "[1/12]" in stdout and "[12/12]" in stdout


def test_table_has_expected_rows_and_sane_numbers(quick_run):
    out, _, _ = quick_run
    md = (out / "results.md").read_text()
    lines = [ln for ln in md.splitlines() if ln.startswith("| ")]
    header = _cells(lines[0])
    for col in ("model", "scheme", "framework", "ms/step (median)", "p10 / p90 ms", "speed vs eager", "GFLOP/s", "% of FMA peak",
                "train mem MiB"):
        assert col in header, col
    col = {name: i for i, name in enumerate(header)}
    rows = [_cells(ln) for ln in lines[1:] if not ln.startswith("| model/scheme") and len(_cells(ln)) == len(header)]

    expected = {(w.title, s, fw) for w in workloads(quick=True) for s in ("full", "last layer", "sparse")
                for fw in ("pockengine", "eager")}
    got = {(r[col["model"]], r[col["scheme"]], r[col["framework"]]) for r in rows}
    assert got == expected
    assert len(rows) == len(expected) == 24

    by = {(r[col["model"]], r[col["scheme"]], r[col["framework"]]): r for r in rows}
    for (model, scheme, fw), r in by.items():
        ms = float(r[col["ms/step (median)"]])
        assert ms > 0, (model, scheme, fw)
        ratio = float(r[col["speed vs eager"]].rstrip("x"))
        eager_ms = float(by[(model, scheme, "eager")][col["ms/step (median)"]])
        assert ratio > 0
        # ratio = eager / ours, up to the table's rounding to 2 decimals
        assert math.isclose(ratio, eager_ms / ms, rel_tol=0.02, abs_tol=0.011), (model, scheme, fw, ratio, eager_ms, ms)
        if fw == "eager":
            assert r[col["speed vs eager"]] == "1.00x"
        spread = r[col["p10 / p90 ms"]]  # the spread of the timed steps (n/a: too few steps for percentiles)
        if spread != "n/a":
            p10, p90 = (float(v) for v in spread.split(" / "))
            assert p10 <= ms <= p90, (model, scheme, fw, p10, ms, p90)
        gflops, pct = float(r[col["GFLOP/s"]]), float(r[col["% of FMA peak"]])
        assert gflops > 0 and 0 < pct < 100, (model, scheme, fw, gflops, pct)
        assert float(r[col["train mem MiB"]]) >= 0


def test_json_agrees_and_frameworks_train_the_same_model(quick_run):
    out, _, _ = quick_run
    data = json.loads((out / "results.json").read_text())
    meta, rows = data["meta"], data["rows"]
    assert meta["peak"]["all_gflops"] > 0 and meta["peak"]["single_gflops"] > 0
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(ok) == 24, [r.get("reason") for r in rows if r["status"] != "ok"]
    by = {(r["workload"], r["scheme"], r["framework"]): r for r in ok}
    for (wl, scheme, fw), r in by.items():
        eager = by[(wl, scheme, "eager")]
        assert r["n"] >= meta["steps"] and r["ms"] > 0
        assert math.isclose(r["ratio"], eager["ms"] / r["ms"], rel_tol=1e-9)
        assert math.isclose(r["gflops"], r["flops_per_step"] / (r["ms"] / 1000) / 1e9, rel_tol=1e-9)
        # the same initial weights and batches: the same first loss, and (the same update) close later
        assert math.isfinite(r["first_loss"]) and math.isclose(r["first_loss"], eager["first_loss"], rel_tol=1e-4)
        assert math.isclose(r["final_loss"], eager["final_loss"], rel_tol=2e-3), (wl, scheme, fw)


def test_plot_written(quick_run):
    out, _, _ = quick_run
    png = out / "results.png"
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_thread_check_flags_only_pockengine_rows_slower_on_more_threads():
    report = _bench_module("report")
    slower_on_more_threads, thread_lines = report.slower_on_more_threads, report.thread_lines

    def row(fw, ms, scheme="full"):
        return {"title": "m", "scheme": scheme, "framework": fw, "status": "ok", "ms": ms}

    rows = [row("pockengine", 10.0), row("pockengine-1t", 12.0), row("eager", 30.0), row("eager-1t", 20.0),
            row("pockengine", 10.4, "sparse"), row("pockengine-1t", 10.0, "sparse"),
            row("pockengine-v3", 11.0), row("pockengine-v3-1t", 10.0)]
    # eager is slower on 2 threads but is not ours to check; 10.4 vs 10.0 is within the 5% noise
    slow = slower_on_more_threads(rows)
    assert len(slow) == 1 and "pockengine-v3" in slow[0], slow
    text = "\n".join(thread_lines(rows))
    assert "| m | full | eager | 20.0 | 30.0 | 0.67x (slower) |" in text, text


def test_slow_cpu_vulkan_rows_are_not_timed():
    """A Vulkan row on lavapipe whose warm-up step took seconds is reported n/a, not timed 20 times;
    a fast one, a GPU one and every other framework are timed whatever their step time."""
    run = _bench_module("run")
    cpu_vk = {"notes": ["Vulkan on llvmpipe (LLVM 15.0.6, 256 bits) (CPU Vulkan: a sanity check, not a GPU timing)"]}
    slow = run.CPU_VULKAN_MAX_STEP_S + 1
    assert "not timed" in run.untimed_reason("pockengine-vulkan", {**cpu_vk, "warmup_s": [slow + 3, slow]})
    assert run.untimed_reason("pockengine-vulkan", {**cpu_vk, "warmup_s": [slow, 0.4]}) is None
    assert run.untimed_reason("pockengine-vulkan", {"notes": ["Vulkan on Adreno 740"], "warmup_s": [slow]}) is None
    assert run.untimed_reason("executorch", {"notes": [], "warmup_s": [17.0]}) is None


def test_llm_speed_targets_prefer_the_interleaved_run():
    targets = _bench_module("targets")

    def run(rows, interleave):
        return {"meta": {"model": "smollm2", "interleave": interleave, "fma_peak": 100.0},
                "rows": {r: {"ms_per_step": ms, "flops_per_step": 1e9, "train_mem_mib": 10.0,
                             "peak_rss_mib": 100.0, "loss_last": 2.0} for r, ms in rows.items()}}

    apart = run({"pytorch-full": 1000.0, "pockengine-full": 1000.0, "pytorch-lora": 400.0,
                 "pockengine-lora": 800.0, "pockengine-sparse-bf16": 1.0}, False)
    inter = run({"pytorch-full": 1000.0, "pockengine-full": 500.0}, True)
    by = {t.what: t for t in targets.llm_targets(apart, inter)}
    full, lora = by["SmolLM2 full vs PyTorch full"], by["SmolLM2 LoRA vs PyTorch LoRA"]
    assert full.value == 2.0 and "interleaved" in full.detail, full   # measured in one process
    assert lora.value == 0.5 and "interleaved" not in lora.detail, lora  # only measured apart
    # memory needs the per-process run (PyTorch full's own peak RSS)
    assert by["sparse + bf16 frozen: training memory / PyTorch full peak"].value == 0.1
    alone = {t.what: t for t in targets.llm_targets(None, inter)}
    assert alone["sparse + bf16 frozen: training memory / PyTorch full peak"].value is None


def test_workers_import_this_checkouts_toolchain(monkeypatch, tmp_path):
    """bench/run.py's workers run in bench/: a relative PYTHONPATH entry is made absolute from the
    caller's directory and the checkout's toolchain/ comes first (a relative `toolchain` once made
    a worktree's bench measure another checkout's package)."""
    run = _bench_module("run")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", "toolchain" + os.pathsep + "extra")
    paths = run.worker_env(1)["PYTHONPATH"].split(os.pathsep)
    assert paths == [str(ROOT / "toolchain"), str(tmp_path / "toolchain"), str(tmp_path / "extra")]
