"""Build the tiny model with the runtime (build_shared_library), link the plain-C
test test_c_api.c against the library and run it."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
try:
    import pockengine.build.host  # noqa: F401
except ImportError:  # not installed: use the checkout
    sys.path.insert(0, str(ROOT / "toolchain"))
from pockengine.build.host import build_shared_library  # noqa: E402
from pockengine.errors import PockError  # noqa: E402

TINY = HERE / "fixtures" / "tiny_model.cpp"


@pytest.fixture(scope="module")
def tiny_lib(tmp_path_factory):
    return build_shared_library([TINY], tmp_path_factory.mktemp("lib"), kernels=False)


def test_c_api(tiny_lib, tmp_path):
    exe = tmp_path / "test_c_api"
    cc = os.environ.get("CC", "gcc")
    subprocess.run([cc, "-std=c99", "-Wall", "-Wextra", "-Werror", "-I", str(ROOT / "native/runtime/include"),
                    str(HERE / "test_c_api.c"), str(tiny_lib), f"-Wl,-rpath,{tiny_lib.parent}", "-lm",
                    "-o", str(exe)], check=True)
    work = tmp_path / "work"
    work.mkdir()
    r = subprocess.run([str(exe), str(work)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "ALL OK" in r.stdout, r.stdout + r.stderr


def test_only_the_c_api_is_exported(tiny_lib):
    r = subprocess.run(["nm", "-D", "--defined-only", str(tiny_lib)], capture_output=True, text=True, check=True)
    names = {line.split()[-1] for line in r.stdout.splitlines() if line.strip()}
    header = (ROOT / "native/runtime/include/pock.h").read_text()
    api = {w.split("(")[0] for w in header.split() if w.startswith("pock_") and "(" in w}
    assert api and api <= names
    assert "pock_compiled_model" not in names  # internal to the library
    assert not [n for n in names if not n.startswith("_Z") and n.startswith("pock") and n not in api]


def test_cache_reuses_runtime_objects(tmp_path, monkeypatch):
    monkeypatch.setenv("POCK_CACHE_DIR", str(tmp_path / "cache"))
    first = build_shared_library([TINY], tmp_path / "a", kernels=False)
    objs = sorted((tmp_path / "cache" / "obj").glob("*.o"))
    stamps = {p: p.stat().st_mtime_ns for p in objs}
    # a different model TU: only it is compiled, the runtime objects are reused
    other = tmp_path / "other_model.cpp"
    other.write_text(TINY.read_text().replace('"7e57000000000001"', '"7e570000000000ff"'))
    second = build_shared_library([other], tmp_path / "b", kernels=False)
    new = sorted((tmp_path / "cache" / "obj").glob("*.o"))
    assert len(new) == len(objs) + 1
    assert all(p.stat().st_mtime_ns == stamps[p] for p in objs)
    assert first.name != second.name
    # the same inputs again: the same library, nothing rebuilt
    assert build_shared_library([TINY], tmp_path / "a", kernels=False) == first
    # flags are part of the key
    third = build_shared_library([TINY], tmp_path / "c", ["-DTINY_MULTI"], kernels=False)
    assert third.name != first.name
    named = build_shared_library([TINY], tmp_path / "d", kernels=False, name="libtiny.so")
    assert named.name == "libtiny.so" and named.read_bytes() == first.read_bytes()


def test_compiler_errors_raise_pock_error(tmp_path, monkeypatch):
    monkeypatch.setenv("POCK_CACHE_DIR", str(tmp_path / "cache"))
    bad = tmp_path / "bad_model.cpp"
    bad.write_text("int broken( { return 0; }\n")
    with pytest.raises(PockError, match="C\\+\\+ compilation failed.*bad_model.cpp"):
        build_shared_library([bad], tmp_path / "out", kernels=False)
    with pytest.raises(PockError, match="does not exist"):
        build_shared_library([tmp_path / "nope.cpp"], tmp_path / "out", kernels=False)
    monkeypatch.setenv("CXX", "no-such-compiler-xyz")
    with pytest.raises(PockError, match="not found"):
        build_shared_library([TINY], tmp_path / "out", kernels=False)


def test_concurrent_builds_agree(tmp_path):
    """Two processes building the same library into one cache at once."""
    env = dict(os.environ, POCK_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(ROOT / "toolchain"))
    code = ("import sys; from pathlib import Path; from pockengine.build.host import build_shared_library as b; "
            f"print(b([Path({str(TINY)!r})], Path(sys.argv[1]), kernels=False))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / f"out{i}")], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(3)]
    results = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), results
    libs = [Path(out.strip()) for out, _ in results]
    assert len({lib.name for lib in libs}) == 1
    assert len({lib.read_bytes() for lib in libs}) == 1
    assert not list((tmp_path / "cache").rglob("*.tmp-*"))
