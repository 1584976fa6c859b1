"""Build a model's shared library for this machine: the generated model TU(s)
linked with the runtime (native/runtime/*.cpp) and the kernels
(native/runtime/kernels/*.cpp), with the system C++ compiler.

Everything is cached under POCK_CACHE_DIR (default ~/.cache/pockengine):

    obj/<stem>-<key>.o    one object per source; key = hash of the compiler, the
                          flags, the source and the headers it can see.  The
                          runtime and kernel objects are compiled once and shared
                          by every model, so a new model compiles only its own TU.
    lib/<stem>-<key>.so   one library per set of objects; key = hash of the
                          compiler, the flags and the objects' contents.

Every entry is stored with its SHA-256 (build/cache.py: `<entry>.sha256`),
written to a temporary name, fsynced and renamed into place under a file lock,
so several processes (pytest-xdist workers) can build at once.  An entry is
checked against its digest before it is linked, copied or loaded; a damaged one
is reported, discarded and rebuilt.  A library must define the model
(pock_compiled_model) before it is cached.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, Sequence

try:
    import fcntl
except ImportError:  # not POSIX: atomic renames alone keep the cache consistent
    fcntl = None

from ..errors import PockError
from . import cache

ROOT = Path(__file__).resolve().parents[3]  # the checkout (sdk-android/, .tools/), when running from one
PACKAGE_CODEGEN = (Path(__file__).resolve().parents[1] / "_native").resolve()  # native/, shipped as package data
BASE_FLAGS = ("-O3", "-std=c++17", "-fPIC", "-fvisibility=hidden", "-pthread")
# The instruction set host builds target: POCK_MARCH (default native) is g++'s -march, so the
# same tests run the kernels a user's machine would take: native, x86-64-v3 (AVX2+FMA) or
# x86-64 (baseline SSE2, the portable vector path). See README "Testing".
MARCH_ENV = "POCK_MARCH"
# A generated model TU holds only glue (one kernel call per node, in functions of at most
# EmitOptions.chunk_nodes nodes): -O1 runs it as fast as -O3 and compiles in about half the time
# (the 30-layer SmolLM2 step: 8.0 s -> 4.4 s).  The runtime and kernels keep -O3.  A constant: the
# default of the builds' model_opt= (build_shared_library, the Android and iOS builds), which a
# caller passes explicitly to build otherwise (bench/compile_profile.py --old-codegen: -O3).
MODEL_OPT = "-O1"
_OPT_LEVELS = ("-O0", "-O1", "-O2", "-O3", "-Os", "-Oz", "-Og", "-Ofast")
CACHE_VERSION = "cache-v2"  # entries with digests (build/cache.py); older entries are never read


def march_flags(march: str | None = None) -> tuple[str, ...]:
    """-march for host builds: `march` when given (a build's march= argument), else $POCK_MARCH,
    default native."""
    where = "march" if march is not None else MARCH_ENV
    if march is None:
        march = os.environ.get(MARCH_ENV, "native")
    march = march.strip() or "native"
    if not all(c.isalnum() or c in "-_.+" for c in march):
        raise PockError(f"{where}={march!r} is not a -march value (e.g. native, x86-64-v3, x86-64)")
    return (f"-march={march}",)
_STDERR_TAIL = 4000


def runtime_dir(runtime=None) -> Path:
    """The runtime tree a build compiles: `runtime` when given (a build against another tree's
    native/runtime, e.g. a bench timing the kernels before a change), else native/runtime as
    shipped in the package (the POCK_RUNTIME_DIR environment variable overrides that)."""
    if runtime is not None:
        return Path(runtime)
    return Path(os.environ.get("POCK_RUNTIME_DIR", PACKAGE_CODEGEN / "runtime"))


def model_flags(flags: Sequence[str], model_opt: str = MODEL_OPT) -> tuple[str, ...]:
    """The flags of a generated model TU: `flags` (the runtime's) with -O3 made `model_opt`."""
    if model_opt not in _OPT_LEVELS:
        raise PockError(f"model_opt must be one of {', '.join(_OPT_LEVELS)}, got {model_opt!r}")
    return tuple(model_opt if f == "-O3" else f for f in flags)


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


def runtime_sources(kernels: bool = True, runtime=None) -> list[Path]:
    rt = runtime_dir(runtime)
    srcs = sorted(rt.glob("*.cpp"))
    srcs += sorted((rt / "tokenizer").glob("*.cpp"))  # pock_tokenizer_* (pock.h), in every model library
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
    lock = target.parent / (target.name + ".lock")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        f = open(lock, "a+")
    except OSError as e:
        raise cache.write_failed(Path(e.filename) if e.filename else lock, e) from None
    with f:
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


_FULL = ("No space left on device", "Read-only file system", "Permission denied", "Disk quota exceeded")


def _produce(target: Path, cmd_for: _Command, what: str, check: Callable[[Path], None] | None = None) -> Path:
    """Run cmd_for(tmp) to make target unless a verified entry exists (build/cache.py: a
    damaged one is reported and rebuilt); `check(tmp)` vets the result before it is stored.
    Atomic and locked."""
    if cache.entry_ok(target):
        return target
    with _locked(target):
        if not cache.entry_ok(target):
            cache.remove_dead_temps(target.parent)
            tmp = cache.temp_name(target)
            try:
                try:
                    _run(cmd_for(tmp), what)
                except PockError as e:
                    if any(w in str(e) for w in _FULL):
                        raise PockError(f"{e}\ncannot write the build cache file {str(tmp)!r}: set POCK_CACHE_DIR "
                                        f"to a writable directory with free space") from None
                    raise
                if check is not None:
                    check(tmp)
                cache.store(tmp, target)
            finally:
                tmp.unlink(missing_ok=True)
    return target


def content_key(paths: Iterable[Path]) -> list[str]:
    """The recorded digests of verified cache entries (what a library built from them is keyed by)."""
    return [cache.digest_of(Path(p)) for p in paths]


def check_defines_model(lib: Path) -> None:
    """A model library must define pock_compiled_model: an emptied or foreign model object
    links into a library without it (found by nm; skipped where nm is missing)."""
    try:
        r = subprocess.run(["nm", "-D", "--undefined-only", str(lib)], capture_output=True, text=True)
    except FileNotFoundError:
        return
    if r.returncode == 0 and re.search(r"\bpock_compiled_model\b", r.stdout):
        raise PockError(f"linking {lib.name}: no object defines the model (pock_compiled_model is undefined); "
                        f"a model object is empty or damaged: not cached")


def compile_objects(jobs: Sequence[tuple[Path, tuple[str, ...], str]], cxx: Sequence[str], *, subdir: str = "obj",
                    what: str = "C++ compilation", compiler_id: str | None = None, runtime=None,
                    timings: dict | None = None) -> list[Path]:
    """Compile each (source, flags, headers key) with `cxx` into the object cache
    cache_dir()/subdir, keyed by the compiler (`compiler_id`, default its --version),
    the command, the flags, the headers key (a digest of the headers the source sees)
    and the source's name and bytes.  Missing objects are built in parallel, each
    atomically under a file lock (pytest-xdist workers share the cache).  The key names
    the runtime directory (`runtime`, default runtime_dir()) as <runtime>: the same runtime
    installed elsewhere (a checkout, a wheel) is the same object.  timings: when given, each
    object compiled here stores its compiler's wall seconds in it under the source's name."""
    cxx = tuple(cxx)
    cid = _compiler_id(cxx) if compiler_id is None else compiler_id
    rt = str(runtime_dir(runtime))
    objs = []
    for src, flags, headers_key in jobs:
        h = hashlib.sha256()
        for part in (CACHE_VERSION, cid, " ".join(cxx), "\0".join(f.replace(rt, "<runtime>") for f in flags), headers_key, src.name):
            h.update(part.encode() + b"\0")
        h.update(src.read_bytes())
        obj = cache_dir() / subdir / f"{src.stem}-{h.hexdigest()[:24]}.o"
        objs.append((obj, lambda tmp, src=src, flags=flags: [*cxx, *flags, "-c", str(src), "-o", str(tmp)], src))
    todo = [(obj, cmd, src) for obj, cmd, src in objs if not cache.entry_ok(obj)]

    def produce(obj, cmd, src):
        t = time.perf_counter()
        _produce(obj, cmd, what)
        if timings is not None:
            timings[src.name] = time.perf_counter() - t
    if todo:
        with ThreadPoolExecutor(max_workers=min(len(todo), os.cpu_count() or 1)) as pool:
            for f in [pool.submit(produce, *job) for job in todo]:
                f.result()
    return [obj for obj, _, _ in objs]


def build_shared_library(
    sources: list[Path],
    out_dir: Path,
    extra_flags: Sequence[str] = (),
    *,
    kernels: bool = True,
    name: str | None = None,
    model_opt: str = MODEL_OPT,
    runtime=None,
    march: str | None = None,
    timings: dict | None = None,
) -> Path:
    """Compile the model TU(s) in `sources` with the runtime (and, when
    `kernels`, every kernel) into a shared library and copy it into out_dir.

    Only the pock_* functions of pock.h are exported.  `extra_flags` go to
    every compile and to the link (and into every cache key).  The library is
    named `name` when given, else lib<first source stem>-<key>.so: a new name
    for new contents, so a process never dlopen()s a stale library of the same
    name.  A compiler failure raises PockError with the end of its output.
    model_opt: the model TUs' optimisation level (the runtime and kernels keep -O3);
    runtime: the native/runtime tree to build with (default runtime_dir()).  Both are in
    every cache key (the flags, the sources and headers).  march: g++'s -march for this
    build (default march_flags(): $POCK_MARCH or native).  timings: compile_objects'.
    """
    sources = [Path(s).resolve() for s in sources]
    if not sources:
        raise PockError("build_shared_library: no model sources given")
    for s in sources:
        if not s.is_file():
            raise PockError(f"build_shared_library: source {str(s)!r} does not exist")
    rt = runtime_dir(runtime)
    cxx = compiler()
    flags = (*BASE_FLAGS, *march_flags(march), "-I", str(rt / "include"), "-I", str(rt), *extra_flags)
    runtime_headers = _digest(sorted(rt.rglob("*.h")))

    jobs = [(s, flags, runtime_headers) for s in runtime_sources(kernels, rt)]
    tu_flags = model_flags(flags, model_opt)
    for i, s in enumerate(sources):  # a model TU also sees the headers beside it; first: the longest jobs
        jobs.insert(i, (s, (*tu_flags, "-I", str(s.parent)), runtime_headers + _digest(sorted(s.parent.glob("*.h")))))
    obj_paths = compile_objects(jobs, cxx, runtime=rt, timings=timings)
    objs = [str(obj) for obj in obj_paths]
    key = hashlib.sha256("\0".join([CACHE_VERSION, _compiler_id(cxx), *cxx, *content_key(obj_paths), *flags])
                         .encode()).hexdigest()[:24]
    stem = sources[0].stem
    lib_entry = cache_dir() / "lib" / f"{stem}-{key}.so"
    out_dir = Path(out_dir)
    dest = out_dir / (name or f"lib{stem}-{key[:12]}.so")
    for _ in range(2):  # a library damaged between its check and the copy is rebuilt once
        lib = _produce(lib_entry, lambda tmp: [*cxx, "-shared", *flags, *objs, "-o", str(tmp), *extra_flags],
                       "linking", check=check_defines_model)
        want = cache.digest_of(lib)
        if name is None and cache.copy_ok(dest, want):
            return dest
        if cache.copy_entry(lib, dest) == want:
            return dest
        cache.discard(lib, "it changed while being copied")
    raise PockError(f"the cached library {str(lib_entry)!r} keeps changing while copied to {str(dest)!r}")


def build_kernel_library(extra_sources: Sequence[Path], extra_flags: Sequence[str] = (), *,
                         name: str | None = None, runtime: Path | None = None, march: str | None = None,
                         opt: str = "-O3") -> Path:
    """Every kernel (runtime/kernels/*.cpp) and the thread pool they run on, plus `extra_sources`
    (extern "C" shims over the pk:: kernels), as one shared library with the shims' symbols
    visible: how the kernel tests (tests/native/runtime) and benches (bench/gemm_llm.py,
    bench/kernels_cnn.py) call kernels from ctypes.  Cached by content (compiler, flags, sources,
    the runtime's headers) under cache_dir()/shims.  `runtime`: another tree's native/runtime (a
    bench timing the kernels before a change); `march`: g++'s -march (default march_flags())."""
    rt = Path(runtime) if runtime is not None else runtime_dir()
    srcs = [*sorted((rt / "kernels").glob("*.cpp")), rt / "threadpool.cpp", *map(Path, extra_sources)]
    cxx = compiler()
    flags = [opt, "-std=c++17", "-fPIC", "-shared", *march_flags(march),
             *extra_flags]
    h = hashlib.sha256(" ".join([CACHE_VERSION, *cxx, *flags]).encode())
    for src in srcs + sorted(rt.rglob("*.h")):  # kernels/*.h too (conv_common.h, rnn_math.h)
        h.update(src.read_bytes())
    lib = cache_dir() / "shims" / f"{name or srcs[-1].stem}-{h.hexdigest()[:16]}.so"
    return _produce(lib, lambda tmp: [*cxx, *flags, "-I", str(rt / "include"), "-I", str(rt), *map(str, srcs),
                                      "-o", str(tmp)], f"building the kernel library {lib.name}")
