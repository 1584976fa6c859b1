"""bench/'s scripts import each other as a DAG (lazy imports included), and their shared helpers
sit in one leaf module, bench/tables.py (issue 35: run -> kernels_bw -> report -> kernels_bw and
targets -> run were a circle)."""
import ast
import graphlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"


def bench_imports() -> dict[str, set[str]]:
    modules = {p.stem for p in BENCH.glob("*.py")}
    edges = {}
    for name in modules:
        found = set()
        for node in ast.walk(ast.parse((BENCH / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module:
                found.add(node.module.split(".")[0])
            elif isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
        edges[name] = {m for m in found if m in modules and m != name}
    return edges


def test_bench_imports_form_a_dag():
    edges = bench_imports()
    assert {"run", "report", "kernels_bw", "targets", "tables"} <= set(edges)
    try:
        graphlib.TopologicalSorter(edges).static_order()
    except graphlib.CycleError as e:
        raise AssertionError(f"import cycle: {' -> '.join(e.args[1])}") from None


def test_the_shared_helpers_are_a_leaf():
    edges = bench_imports()
    assert edges["tables"] == set()
    assert "tables" in edges["report"] and "tables" in edges["targets"] and "tables" in edges["run"]
    assert "run" not in edges["targets"] and "kernels_bw" not in edges["report"]
