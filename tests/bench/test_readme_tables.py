"""bench/readme_tables.py: README.md's SmolLM2 table is what bench/llm_*.json say, not a copy."""
import copy
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("readme_tables", ROOT / "bench" / "readme_tables.py")
readme_tables = importlib.util.module_from_spec(spec)
spec.loader.exec_module(readme_tables)


def test_the_committed_readme_table_is_the_committed_results():
    assert readme_tables.main(["--check"]) == 0


def test_every_figure_comes_from_the_results():
    results, inter = readme_tables._load("llm_results.json"), readme_tables._load("llm_interleaved.json")
    table = readme_tables.render(results, inter)
    changed = copy.deepcopy(results)
    changed["rows"]["pockengine-sparse-q4"]["train_mem_mib"] = 123.4
    changed["rows"]["pockengine-sparse-q4"]["state_mib"] = 99.0
    other = readme_tables.render(changed, inter)
    rows = results["rows"]
    mem = " / ".join(f"{rows[n]['train_mem_mib']:.0f}" for n in ("pockengine-sparse-bf16", "pockengine-sparse-int8"))
    ckpt = " / ".join(f"{rows[n]['state_mib']:.0f}" for n in ("pockengine-sparse-bf16", "pockengine-sparse-int8"))
    assert f"| {mem} / 123 | {ckpt} / 99 |" in other and other != table
    fast = copy.deepcopy(inter)
    fast["rows"]["pockengine-full"]["ms_per_step"] = fast["rows"]["pytorch-full"]["ms_per_step"] / 3
    assert "PockEngine full is 3.00x PyTorch full" in readme_tables.render(results, fast)
