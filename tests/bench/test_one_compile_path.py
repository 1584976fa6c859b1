"""bench/ compiles through the one compile path (issue 35): no script runs pe.compile's stages
itself (program.compile_spec with timings= times them), and none flips a module global or the
runtime directory to change how a step is built (program.build's model_opt= and runtime=)."""
import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
STAGES = {"lower", "schedule_program", "plan_program", "Program", "store_frozen_lowp", "resolve_trained"}


def _scripts():
    return sorted([*BENCH.glob("*.py"), *BENCH.glob("search/*.py")])


def _pockengine_names(tree) -> set[str]:
    """The names a script binds to pockengine modules (`from pockengine.build import host`,
    `from pockengine.compiler import program as P`, `import pockengine as pe`)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pockengine"):
            names |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
            names |= {a.asname or a.name for a in node.names if a.name.startswith("pockengine")}
    return names


def test_no_bench_script_copies_the_compile_stages():
    for path in _scripts():
        tree = ast.parse(path.read_text())
        modules = _pockengine_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                f = node.func
                if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in modules:
                    name = f.attr  # P.lower(...)
                elif isinstance(f, ast.Name) and f.id in modules:
                    name = f.id  # from pockengine.compiler.program import lower; lower(...)
                else:
                    continue
                assert name not in STAGES, f"{path.name}:{node.lineno} calls {name} (use program.compile_spec)"


def test_no_bench_script_sets_a_pockengine_global_or_the_runtime_dir():
    for path in _scripts():
        tree = ast.parse(path.read_text())
        modules = _pockengine_names(tree)
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
                if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            for t in targets:
                for e in (t.elts if isinstance(t, ast.Tuple) else [t]):
                    if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name):
                        assert e.value.id not in modules, f"{path.name}:{node.lineno} sets {e.value.id}.{e.attr}"
                    if isinstance(e, ast.Subscript) and isinstance(e.slice, ast.Constant):
                        assert e.slice.value != "POCK_RUNTIME_DIR", f"{path.name}:{node.lineno} sets POCK_RUNTIME_DIR"
