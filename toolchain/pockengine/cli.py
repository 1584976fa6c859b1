"""pock-build: compile a training step for the host, Android or iOS.

    pock-build SPEC --platform {host,android,ios} [--soc sm8550] [--out DIR] [--profile]
               [--abi arm64-v8a ...] [--cxx PATH] [--coreml] [--backends cpu,vulkan,htp,coreml]
               [--search --budget-mb N [--report FILE]]

Each platform's build lives in its own module: build_host below,
platforms/android.py (an AAR) and platforms/ios.py (an XCFramework and a Swift
package); every one of them also writes the model bundle (bundle.py).
--search picks the update scheme for the budget first (search.py).

--profile (host): after building, run 20 training steps on the spec's example
inputs with per-op profiling, print the table and write it to DIR/profile.md.

SPEC is `path/to/file.py:function` (the function returns pe.compile's keyword
arguments) or a `pock.toml` naming such a function:

    [model]
    spec = "model.py:make"   # relative to the toml file
    name = "keyboard"        # optional
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

from .errors import PockError


def load_spec(spec: str) -> tuple[dict, str | None]:
    """The keyword arguments of pe.compile described by SPEC, and an optional name."""
    name = None
    if spec.endswith(".toml"):
        import tomllib
        path = Path(spec)
        if not path.is_file():
            raise PockError(f"spec file {spec!r} does not exist")
        with open(path, "rb") as f:
            try:
                doc = tomllib.load(f)
            except tomllib.TOMLDecodeError as e:  # e.g. "Expected '=' after a key (at line 3, column 6)"
                raise PockError(f"{spec}: not valid TOML: {e}") from None
        unknown = sorted(set(doc) - {"model"})
        conf = doc.get("model", {})
        if unknown or not isinstance(conf, dict):
            raise PockError(f"{spec}: unknown table {unknown[0] if unknown else 'model'!r}; a pock.toml has one "
                            f"[model] table with the keys {', '.join(TOML_KEYS)}")
        bad = sorted(set(conf) - set(TOML_KEYS))
        if bad:
            raise PockError(f"{spec}: [model] has an unknown key {bad[0]!r}{_did_you_mean(bad[0], TOML_KEYS)}; "
                            f"valid keys: {', '.join(TOML_KEYS)}")
        if not all(isinstance(conf.get(k, ""), str) for k in TOML_KEYS):
            raise PockError(f"{spec}: [model] keys {', '.join(TOML_KEYS)} take strings")
        if "spec" not in conf:
            raise PockError(f"{spec}: [model] needs spec = \"file.py:function\"")
        name = conf.get("name")
        spec = str((path.parent / conf["spec"]).resolve()) if ":" in conf["spec"] else conf["spec"]
    if ":" not in spec:
        raise PockError(f"SPEC must be 'path/to/file.py:function' or a pock.toml, got {spec!r}")
    file, func = spec.rsplit(":", 1)
    path = Path(file)
    if not path.is_file():
        raise PockError(f"spec file {file!r} does not exist")
    module_spec = importlib.util.spec_from_file_location(f"pock_spec_{path.stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    sys.path.insert(0, str(path.parent.resolve()))
    try:
        module_spec.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    if not hasattr(module, func):
        raise PockError(f"{file} has no function {func!r}")
    kwargs = getattr(module, func)()
    if not isinstance(kwargs, dict) or "model" not in kwargs:
        raise PockError(f"{spec} must return a dict of pe.compile keyword arguments (model, example_inputs, ...)")
    valid = spec_keys()
    for key in kwargs:
        if key not in valid:
            raise PockError(f"{spec} returned an unknown key {key!r}{_did_you_mean(key, valid)}; valid keys: "
                            f"{', '.join(valid)}")
    return kwargs, name


TOML_KEYS = ("spec", "name")


def spec_keys() -> list[str]:
    """The keys a spec function may return: pe.compile's keyword arguments, and `sample_batches`
    (the data `--search` scores schemes on)."""
    import dataclasses
    from .compiler.program import CompileSpec
    return [f.name for f in dataclasses.fields(CompileSpec)] + ["sample_batches"]


def _did_you_mean(key: str, valid) -> str:
    import difflib
    close = difflib.get_close_matches(str(key), list(valid), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def build_host(prog, out: Path, backends=None, soc: str | None = None) -> dict:
    """Sources, CMakeLists.txt, the library, initial weights, the model bundle
    and the summary in out/ (build/package.package for the host).  With "htp" among the
    backends the frozen prefix is split off, compiled to a QNN context binary for `soc` and
    recorded in the bundle; the library is then the step that follows it."""
    from .backends import get
    from .build.package import Target, package
    from .compiler.program import check_backends
    backends = check_backends(backends)
    off = [b for b in backends if "host" not in get(b).platforms]
    if off:  # e.g. the reference interpreter: it runs in Python and builds nothing to ship
        where = "; ".join(f"{b} builds for --platform {','.join(get(b).platforms)}"
                          for b in off if get(b).platforms)
        raise PockError(f"--platform host: --backends {','.join(off)} "
                        f"{'builds' if len(off) == 1 else 'build'} no library for a device"
                        + (f" ({where})" if where else ""))
    return package(prog, backends, Target("host", _host_compile, _host_layout, prefix_soc=soc), out)


def _host_compile(step, source, cpp: Path) -> dict:
    """The host library of the written source (its step backend's, build/package.compile_library)."""
    from .build.package import compile_library
    lib = compile_library(step, source, cpp.parent / "build")
    target = cpp.parent / f"libpock_{step.name}{lib.suffix}"
    target.write_bytes(lib.read_bytes())
    return {"library": target}


def _host_layout(step, source, out: Path, libraries: dict, weights: Path, bundle: Path, prefix_entry) -> dict:
    """CMakeLists.txt beside the source; the files pock-build lists."""
    from .codegen import RUNTIME_DIR
    (out / "CMakeLists.txt").write_text(cmake_lists(step.name, RUNTIME_DIR, vulkan="vulkan" in source.backends))
    files = {"library": libraries["library"], "weights": weights}
    if prefix_entry is not None and "context_binary" in prefix_entry.get("files", {}):
        files["prefix"] = bundle / prefix_entry["files"]["context_binary"]
    return files


def cmake_lists(name: str, runtime_dir: Path, vulkan: bool = False) -> str:
    """The CMake project of the written source: the runtime and kernels, and with a Vulkan
    partition the Vulkan runtime (native/runtime/vulkan/) linked to the Vulkan loader (the
    shaders are in the source as SPIR-V)."""
    text = f"""cmake_minimum_required(VERSION 3.16)
project(pock_{name} CXX)
# Generated by pock-build. POCK_RUNTIME points at PockEngine's native/runtime.
set(CMAKE_CXX_STANDARD 17)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
set(POCK_RUNTIME "{runtime_dir}" CACHE PATH "PockEngine runtime sources")
file(GLOB POCK_KERNELS "${{POCK_RUNTIME}}/kernels/*.cpp")
file(GLOB POCK_CORE "${{POCK_RUNTIME}}/*.cpp")
"""
    if not vulkan:
        return text + f"""add_library(pock_{name} SHARED {name}.cpp ${{POCK_CORE}} ${{POCK_KERNELS}})
target_include_directories(pock_{name} PUBLIC "${{POCK_RUNTIME}}/include")
set_target_properties(pock_{name} PROPERTIES CXX_VISIBILITY_PRESET hidden)
"""
    return text + f"""# the step's Vulkan partition: the Vulkan runtime, linked to the Vulkan loader
file(GLOB POCK_VULKAN "${{POCK_RUNTIME}}/vulkan/*.cpp")
find_package(Vulkan REQUIRED)
find_package(Threads REQUIRED)
add_library(pock_{name} SHARED {name}.cpp ${{POCK_CORE}} ${{POCK_KERNELS}} ${{POCK_VULKAN}})
target_include_directories(pock_{name} PUBLIC "${{POCK_RUNTIME}}/include" PRIVATE "${{POCK_RUNTIME}}"
                           "${{POCK_RUNTIME}}/vulkan")
target_link_libraries(pock_{name} PRIVATE Vulkan::Vulkan Threads::Threads)
set_target_properties(pock_{name} PROPERTIES CXX_VISIBILITY_PRESET hidden)
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="pock-build", description="Compile a PyTorch model's training step.")
    parser.add_argument("spec", help="path/to/file.py:function or pock.toml")
    parser.add_argument("--platform", choices=["host", "android", "ios"], default="host")
    parser.add_argument("--soc", default=None, help="target SoC for android (e.g. sm8550)")
    parser.add_argument("--out", default=None, help="output directory (default: pock-out/<name>)")
    parser.add_argument("--cxx", default=None, help="android: build the natives with this aarch64 C++ compiler")
    parser.add_argument("--abi", action="append", default=None,
                        help="android: ABI to build (repeatable; default arm64-v8a; also armeabi-v7a, x86_64)")
    parser.add_argument("--coreml", action="store_true",
                        help="ios: run the frozen prefix with Core ML (an .mlpackage in the bundle); "
                             "the same as adding coreml to --backends")
    parser.add_argument("--backends", default=None,
                        help="comma-separated backends to partition over, e.g. cpu,vulkan,htp "
                             "(default: cpu on host; the --soc table's on android)")
    parser.add_argument("--ai-hub", action="store_true",
                        help="also compile and profile the frozen prefix on a real device on Qualcomm AI Hub "
                             "(needs qai-hub and an account)")
    parser.add_argument("--search", action="store_true",
                        help="search the update scheme for --budget-mb instead of the spec's `update`")
    parser.add_argument("--budget-mb", type=float, default=None, help="--search: training memory budget in MiB")
    parser.add_argument("--report", default=None, help="--search: write the search report here (.html or .md)")
    parser.add_argument("--seed", type=int, default=0, help="--search: random seed")
    parser.add_argument("--profile", action="store_true",
                        help="host: run 20 steps on the example inputs and print the time per op and kernel "
                             "(also written to OUT/profile.md)")
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except PockError as e:
        print(f"pock-build: error: {e}", file=sys.stderr)
        return 2


def _run(args) -> int:
    import pockengine as pe
    t0 = time.time()
    kwargs, name = load_spec(args.spec)
    if name:
        kwargs.setdefault("name", name)
    if args.platform != "android" and (args.cxx or args.abi):
        raise PockError("--cxx and --abi are for --platform android")
    if args.platform != "ios" and args.coreml:
        raise PockError("--coreml is for --platform ios")
    if args.platform == "ios" and args.soc:  # Apple SoCs need no choice: Core ML picks the ANE/GPU/CPU
        raise PockError(f"--soc {args.soc} is for --platform android (and host builds with the htp backend); "
                        "an iOS build runs on every Apple SoC, so drop --soc")
    backends = [b.strip() for b in args.backends.split(",") if b.strip()] if args.backends else None
    if args.platform == "ios":  # before compiling: the registry says which backends build for iOS
        from .platforms.ios import ios_backends
        backends = ios_backends(backends, coreml=args.coreml)  # --coreml selects the registered "coreml"
    if args.search:
        if args.budget_mb is None:
            raise PockError("--search needs --budget-mb N")
        from .search import search_for_cli
        kwargs["update"] = search_for_cli(kwargs, budget_mb=args.budget_mb, report=args.report, seed=args.seed)
    elif args.budget_mb is not None or args.report:
        raise PockError("--budget-mb and --report go with --search")
    else:
        kwargs.pop("sample_batches", None)  # a spec's sample data for --search
    prog = pe.compile(**kwargs)
    out = Path(args.out or Path("pock-out") / prog.name)
    if args.ai_hub:
        submit_to_ai_hub(prog, args.soc, backends)
    if args.platform == "host":
        files = build_host(prog, out, backends=backends, soc=args.soc)
    elif args.platform == "android":
        from .platforms.android import build_android
        files = build_android(prog, out, soc=args.soc or "generic-arm64", abis=args.abi or ["arm64-v8a"],
                              cxx=args.cxx, backends=backends, spec=kwargs)
    else:
        from .platforms.ios import build_ios
        files = build_ios(prog, out, spec=kwargs, backends=backends)
    s = prog.stats()
    print(f"compiled {prog.name} ({s['num_nodes']} nodes, {s['flops_per_step'] / 1e6:.1f} MFLOP/step, "
          f"arena {s['arena_bytes'] / 2**20:.2f} MiB, state {s['state_bytes'] / 2**20:.2f} MiB) "
          f"in {time.time() - t0:.1f}s")
    for what, path in files.items():
        print(f"  {what:8s} {path}")
    print(f"  summary  {out / 'summary.md'}")
    if args.profile:
        if "prefix" in files:
            raise PockError("--profile profiles the all-CPU step: drop htp from --backends to profile")
        print()
        print(profile_host(files, kwargs, out), end="")
        print(f"  profile  {out / 'profile.md'}")
    return 0


def submit_to_ai_hub(prog, soc: str | None, backends=None) -> None:
    """--ai-hub: compile and profile the frozen prefix on a real device through the registered
    prefix backend with a profile_remote hook (htp: Qualcomm AI Hub); clear errors without an account."""
    from .backends import registered
    hosted = [b for b in registered() if b.role == "prefix" and b.profile_remote is not None]
    chosen = [b for b in hosted if b.name in (backends or ())] or hosted[:1]  # the one asked for, else the first
    if not chosen:
        raise PockError("--ai-hub: no registered backend profiles a prefix on a hosted device")
    backend = chosen[0]
    prefix, _ = backend.split(prog)
    if prefix is None:
        raise PockError(f"--ai-hub: this model has no frozen prefix to run on the {backend.name.upper()} "
                        "(freeze its first layers)")
    result = backend.profile_remote(prefix, soc)
    print(f"Qualcomm AI Hub: compile job {result['compile_job']}, profile job {result['profile_job']}")


PROFILE_STEPS, PROFILE_WARMUP = 20, 3


def profile_host(files: dict, kwargs: dict, out: Path) -> str:
    """Profile the built library from its initial weights on the spec's example
    batch; write out/profile.md and return the table."""
    from .frontends.torch_export import check_example
    from .runtime.profile import format_table
    from .runtime.trainer import Trainer
    inputs = check_example(kwargs["example_inputs"], "example_inputs")
    targets = check_example(kwargs.get("example_targets"), "example_targets")
    with Trainer(files["library"], files["weights"]) as trainer:
        prof = trainer.profile(inputs, targets, steps=PROFILE_STEPS, warmup=PROFILE_WARMUP)
    table = format_table(prof)
    (out / "profile.md").write_text(f"# PockEngine profile `{prof.model}`\n\n{PROFILE_STEPS} training steps "
                                    f"(after {PROFILE_WARMUP} warm-up steps) on the spec's example inputs, from "
                                    f"the initial weights.\n\n{table}")
    return table


if __name__ == "__main__":
    sys.exit(main())
