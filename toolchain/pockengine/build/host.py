"""Build a model's shared library for this machine: the generated model TU(s)
linked with the runtime (codegen/runtime/*.cpp) and the kernels
(codegen/runtime/kernels/*.cpp), with the system C++ compiler.

Everything is cached under POCK_CACHE_DIR (default ~/.cache/pockengine):

    obj/<stem>-<key>.o    one object per source; key = hash of the compiler, the
                          flags, the source and the headers it can see.  The
                          runtime and kernel objects are compiled once and shared
                          by every model, so a new model compiles only its own TU.
    lib/<stem>-<key>.so   one library per set of objects.

Outputs are written to a temporary name and renamed into place, under a file
lock, so several processes (pytest-xdist workers) can build at once.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shlex
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, Sequence

try:
    import fcntl
except ImportError:  # not POSIX: atomic renames alone keep the cache consistent
    fcntl = None

from ..errors import PockError

ROOT = Path(__file__).resolve().parents[3]  # the checkout (sdk-android/, .tools/), when running from one
PACKAGE_CODEGEN = (Path(__file__).resolve().parents[1] / "_codegen").resolve()  # codegen/, shipped as package data
BASE_FLAGS = ("-O3", "-std=c++17", "-fPIC", "-fvisibility=hidden", "-pthread")
# The instruction set host builds target: POCK_MARCH (default native) is g++'s -march, so the
# same tests run the kernels a user's machine would take: native, x86-64-v3 (AVX2+FMA) or
# x86-64 (baseline SSE2, the portable vector path). See README "Testing".
MARCH_ENV = "POCK_MARCH"
# A generated model TU holds only glue (one kernel call per node, in functions of at most
# EmitOptions.chunk_nodes nodes): -O1 runs it as fast as -O3 and compiles in about half the time
# (the 30-layer SmolLM2 step: 8.0 s -> 4.4 s).  The runtime and kernels keep -O3.
MODEL_OPT = "-O1"


def march_flags() -> tuple[str, ...]:
    """-march for host builds: $POCK_MARCH, default native."""
    march = os.environ.get(MARCH_ENV, "native").strip() or "native"
    if not all(c.isalnum() or c in "-_.+" for c in march):
        raise PockError(f"{MARCH_ENV}={march!r} is not a -march value (e.g. native, x86-64-v3, x86-64)")
    return (f"-march={march}",)
_STDERR_TAIL = 4000


def runtime_dir() -> Path:
    """codegen/runtime as shipped in the package (POCK_RUNTIME_DIR overrides it)."""
    return Path(os.environ.get("POCK_RUNTIME_DIR", PACKAGE_CODEGEN / "runtime"))


def cache_dir() -> Path:
    return Path(os.environ.get("POCK_CACHE_DIR", Path.home() / ".cache" / "pockengine"))


def write_source(path: Path, text: str) -> Path:
    """Write a generated source to path (atomically; untouched when it already holds text)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        tmp = path.with_suffix(f".tmp-{os.getpid()}")
        tmp.write_text(text)
        tmp.replace(path)
    return path


def compiler() -> tuple[str, ...]:
    """The C++ compiler command: $CXX (which may hold a launcher, e.g. "ccache g++") or g++."""
    return tuple(shlex.split(os.environ.get("CXX", "g++")))


@functools.lru_cache(maxsize=None)
def _compiler_id(cxx: tuple[str, ...]) -> str:
    try:
        r = subprocess.run([*cxx, "--version"], capture_output=True, text=True)
    except FileNotFoundError:
        raise PockError(f"C++ compiler {' '.join(cxx)!r} not found; install g++ or set CXX") from None
    if r.returncode != 0:
        raise PockError(f"C++ compiler {' '.join(cxx)!r} does not run: {r.stderr.strip()[-_STDERR_TAIL:]}")
    return r.stdout


def runtime_sources(kernels: bool = True) -> list[Path]:
    rt = runtime_dir()
    srcs = sorted(rt.glob("*.cpp"))
    if kernels:
        srcs += sorted((rt / "kernels").glob("*.cpp"))
    return srcs


def _digest(paths: Iterable[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(str(p.name).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


@contextlib.contextmanager
def _locked(target: Path):
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / (target.name + ".lock"), "a+") as f:
        if fcntl is not None:
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(f, fcntl.LOCK_UN)


def _run(cmd: Sequence[str], what: str) -> None:
    try:
        r = subprocess.run(list(cmd), capture_output=True, text=True)
    except FileNotFoundError:
        raise PockError(f"C++ compiler {cmd[0]!r} not found; install g++ or set CXX") from None
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip()[-_STDERR_TAIL:]
        raise PockError(f"{what} failed (exit {r.returncode}): {shlex.join(cmd)}\n{tail}")


_Command = Callable[[Path], list]  # output path -> the compiler command that writes it


def _produce(target: Path, cmd_for: _Command, what: str) -> Path:
    """Run cmd_for(tmp) to make target unless it exists; atomic and locked."""
    if target.exists():
        return target
    with _locked(target):
        if not target.exists():
            tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
            try:
                _run(cmd_for(tmp), what)
                os.replace(tmp, target)
            finally:
                tmp.unlink(missing_ok=True)
    return target


def compile_objects(jobs: Sequence[tuple[Path, tuple[str, ...], str]], cxx: Sequence[str], *, subdir: str = "obj",
                    what: str = "C++ compilation", compiler_id: str | None = None) -> list[Path]:
    """Compile each (source, flags, headers key) with `cxx` into the object cache
    cache_dir()/subdir, keyed by the compiler (`compiler_id`, default its --version),
    the command, the flags, the headers key (a digest of the headers the source sees)
    and the source's name and bytes.  Missing objects are built in parallel, each
    atomically under a file lock (pytest-xdist workers share the cache).  The key names
    the runtime directory as <runtime>: the same runtime installed elsewhere (a checkout,
    a wheel) is the same object."""
    cxx = tuple(cxx)
    cid = _compiler_id(cxx) if compiler_id is None else compiler_id
    rt = str(runtime_dir())
    objs = []
    for src, flags, headers_key in jobs:
        h = hashlib.sha256()
        for part in (cid, " ".join(cxx), "\0".join(f.replace(rt, "<runtime>") for f in flags), headers_key, src.name):
            h.update(part.encode() + b"\0")
        h.update(src.read_bytes())
        obj = cache_dir() / subdir / f"{src.stem}-{h.hexdigest()[:24]}.o"
        objs.append((obj, lambda tmp, src=src, flags=flags: [*cxx, *flags, "-c", str(src), "-o", str(tmp)]))
    todo = [(obj, cmd) for obj, cmd in objs if not obj.exists()]
    if todo:
        with ThreadPoolExecutor(max_workers=min(len(todo), os.cpu_count() or 1)) as pool:
            for f in [pool.submit(_produce, obj, cmd, what) for obj, cmd in todo]:
                f.result()
    return [obj for obj, _ in objs]


def build_shared_library(
    sources: list[Path],
    out_dir: Path,
    extra_flags: Sequence[str] = (),
    *,
    kernels: bool = True,
    name: str | None = None,
) -> Path:
    """Compile the model TU(s) in `sources` with the runtime (and, when
    `kernels`, every kernel) into a shared library and copy it into out_dir.

    Only the pock_* functions of pock.h are exported.  `extra_flags` go to
    every compile and to the link (and into every cache key).  The library is
    named `name` when given, else lib<first source stem>-<key>.so: a new name
    for new contents, so a process never dlopen()s a stale library of the same
    name.  A compiler failure raises PockError with the end of its output.
    """
    sources = [Path(s).resolve() for s in sources]
    if not sources:
        raise PockError("build_shared_library: no model sources given")
    for s in sources:
        if not s.is_file():
            raise PockError(f"build_shared_library: source {str(s)!r} does not exist")
    rt = runtime_dir()
    cxx = compiler()
    flags = (*BASE_FLAGS, *march_flags(), "-I", str(rt / "include"), "-I", str(rt), *extra_flags)
    runtime_headers = _digest(sorted(rt.rglob("*.h")))

    jobs = [(s, flags, runtime_headers) for s in runtime_sources(kernels)]
    model_flags = tuple(MODEL_OPT if f == "-O3" else f for f in flags)
    for i, s in enumerate(sources):  # a model TU also sees the headers beside it; first: the longest jobs
        jobs.insert(i, (s, (*model_flags, "-I", str(s.parent)), runtime_headers + _digest(sorted(s.parent.glob("*.h")))))
    objs = [str(obj) for obj in compile_objects(jobs, cxx)]
    key = hashlib.sha256("\0".join([*cxx, *objs, *flags]).encode()).hexdigest()[:24]
    stem = sources[0].stem
    lib = _produce(cache_dir() / "lib" / f"{stem}-{key}.so",
                   lambda tmp: [*cxx, "-shared", *flags, *objs, "-o", str(tmp), *extra_flags], "linking")

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dest = out_dir / (name or f"lib{stem}-{key[:12]}.so")
    if name is not None or not dest.exists():
        tmp = dest.with_name(f"{dest.name}.tmp-{os.getpid()}")
        shutil.copyfile(lib, tmp)
        os.replace(tmp, dest)
    return dest


def build_kernel_library(extra_sources: Sequence[Path], extra_flags: Sequence[str] = (), *,
                         name: str | None = None, runtime: Path | None = None, march: str | None = None,
                         opt: str = "-O3") -> Path:
    """Every kernel (runtime/kernels/*.cpp) and the thread pool they run on, plus `extra_sources`
    (extern "C" shims over the pk:: kernels), as one shared library with the shims' symbols
    visible: how the kernel tests (tests/codegen/runtime) and benches (bench/gemm_llm.py,
    bench/kernels_cnn.py) call kernels from ctypes.  Cached by content (compiler, flags, sources,
    the runtime's headers) under cache_dir()/shims.  `runtime`: another tree's codegen/runtime (a
    bench timing the kernels before a change); `march`: g++'s -march (default march_flags())."""
    rt = Path(runtime) if runtime is not None else runtime_dir()
    srcs = [*sorted((rt / "kernels").glob("*.cpp")), rt / "threadpool.cpp", *map(Path, extra_sources)]
    cxx = compiler()
    flags = [opt, "-std=c++17", "-fPIC", "-shared", *((f"-march={march}",) if march else march_flags()),
             *extra_flags]
    h = hashlib.sha256(" ".join([*cxx, *flags]).encode())
    for src in srcs + sorted(rt.rglob("*.h")):  # kernels/*.h too (conv_common.h, rnn_math.h)
        h.update(src.read_bytes())
    lib = cache_dir() / "shims" / f"{name or srcs[-1].stem}-{h.hexdigest()[:16]}.so"
    return _produce(lib, lambda tmp: [*cxx, *flags, "-I", str(rt / "include"), "-I", str(rt), *map(str, srcs),
                                      "-o", str(tmp)], f"building the kernel library {lib.name}")
