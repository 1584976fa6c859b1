"""The package's modules import each other as a DAG: no cycle, lazy (function-level)
imports included, read from the source with ast."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "toolchain" / "pockengine"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """{module: the package modules it imports anywhere in its source}."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                found |= {target} | {f"{target}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
        edges[name] = {m for m in found if m in modules and m != name}
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle [a, b, ..., a], or None (depth-first search with colours)."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for n in sorted(edges[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (cycle := visit(n)):
                return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state and (cycle := visit(m)):
            return cycle
    return None


def test_the_checker_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_package_imports_form_a_dag():
    edges = import_graph()
    assert "pockengine.compiler.program" in edges and "pockengine.backends.vulkan" in edges["pockengine.compiler.program"]
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_library_imports_nothing_from_demo_apps():
    """The demo's model and runner live in demo-apps/ and import the library, never the
    reverse."""
    apps = {p.name for p in (PACKAGE.parents[1] / "demo-apps").iterdir() if p.is_dir()}
    assert "keyboard" in apps
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        for node in ast.walk(ast.parse(text, str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            assert not any(n.split(".")[0] in apps for n in names), f"{path.name} imports {names} from demo-apps"
        if path.name != "demo.py":
            assert "demo-apps" not in text, f"{path} reaches into the checkout's demo-apps/"



def test_the_demo_runners_live_in_demo_apps():
    """`make demo` runs the keyboard demo's runner in demo-apps/ (keyboard.sim.demo); the package
    has no demo runner that would have to find demo-apps/ at run time (issue 35)."""
    assert not (PACKAGE / "demo.py").exists()
    assert (PACKAGE.parents[1] / "demo-apps" / "keyboard" / "sim" / "demo.py").is_file()
    assert "cd demo-apps && $(abspath $(PY)) -m keyboard.sim.demo" in (PACKAGE.parents[1] / "Makefile").read_text()
