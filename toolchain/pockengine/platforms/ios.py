"""pock-build --platform ios: an XCFramework, the model bundle and a ready Swift package.

    out/
      <name>.cpp  summary.md             the generated step and its summary
      <Model>.xcframework/               Apple's format (Info.plist lists both slices)
        ios-arm64/libpock_<name>.a                  + Headers/{pock.h, module.modulemap}
        ios-arm64_x86_64-simulator/libpock_<name>.a   (fat: arm64 + x86_64)
      bundle/                             model.json, weights.pockckpt[, prefix/*.mlpackage]
      Package.swift                       a Swift package: the PockEngine Swift layer
      Sources/PockEngine/*.swift            (copied from sdk-ios/), the XCFramework as a
      Sources/Pock<Model>/                  binaryTarget, and the bundle as a resource

Each slice is a static library of the model TU, the runtime and the kernels.
On macOS with Xcode the objects come from `xcrun clang++` and the XCFramework
from `xcodebuild -create-xcframework`; anywhere else zig (PyPI `ziglang`)
cross-compiles them (no iOS SDK needed for static libraries: zig ships the
Darwin libc headers), `zig ar` archives them and macho.write_fat makes the
simulator's universal archive.  Objects are cached by content hash under
$POCK_CACHE_DIR/ios, built under a file lock (as build/host.py does).

With a prefix backend from the registry (backends/__init__.py) that builds for
iOS - "coreml" (backends/coreml.py), which coreml=True / --coreml selects - the
frozen prefix (passes/prefix.py) is split off by its split hook and exported by
its export hook as an ML Program (platforms/coreml.py) into bundle/prefix/; the
static library holds only the rest of the step, whose inputs are the prefix's
outputs.
"""
from __future__ import annotations

import functools
import plistlib
import platform
import shutil
import subprocess
import sys
from pathlib import Path

from ..backends import check_backends, get, split_roles
from ..build.host import MODEL_OPT, _digest, compile_objects, model_flags, runtime_dir, runtime_sources
from ..build.package import Target, package
from ..errors import PockError
from .macho import CPU_ARM64, CPU_X86_64, write_fat

MIN_IOS = "15.0"
SDK_DIR = Path(__file__).resolve().parents[3] / "sdk-ios"
FLAGS = ("-O3", "-std=c++17", "-fvisibility=hidden")  # as build/host.py, minus -march=native
C_MODULE = "PockC"
# XCFramework library identifier -> [(zig target, Apple -arch, Mach-O CPU)]; each list is one archive
SLICES = {
    "ios-arm64": [(f"aarch64-ios.{MIN_IOS}", "arm64", CPU_ARM64)],
    "ios-arm64_x86_64-simulator": [(f"aarch64-ios.{MIN_IOS}-simulator", "arm64", CPU_ARM64),
                                   (f"x86_64-ios.{MIN_IOS}-simulator", "x86_64", CPU_X86_64)],
}
MODULE_MAP = f"""module {C_MODULE} {{
  header "pock.h"
  link "c++"
  export *
}}
"""


def swift_name(name: str) -> str:
    """keyboard_lm -> KeyboardLm: the model's name in Swift (XCFramework, package)."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_") if part) or "Model"


def ios_backends(backends=None, coreml: bool = False) -> list[str]:
    """The checked backend list of an iOS build: registered names that build for iOS (the
    registry's `platforms`), the step on cpu, at most one prefix backend whose check_target
    accepts "ios"; coreml=True (--coreml) adds the registered "coreml" prefix backend."""
    backends = check_backends(backends)
    if coreml and "coreml" not in backends:
        backends = ["coreml", *backends]
    off = [b for b in backends if "ios" not in get(b).platforms]
    if off:
        raise PockError(f"--platform ios builds the step for cpu; --backends {','.join(off)} "
                        f"{'is' if len(off) == 1 else 'are'} not available on iOS in this version")
    prefix_backend, _ = split_roles(backends)
    if prefix_backend is not None and prefix_backend.check_target is not None:
        prefix_backend.check_target("ios")
    return backends


def build_ios(prog, out: Path, coreml: bool = False, spec: dict | None = None, fp16: bool = True,
              backends=None, model_opt: str = MODEL_OPT) -> dict:
    """Write the XCFramework, the bundle and the Swift package for prog into out; returns {label: path}.

    backends: the registered backends to build with (default ["cpu"]); a prefix backend among
    them (coreml=True adds "coreml") runs the frozen prefix, exported by its export hook.
    model_opt: the model TU's optimisation level (build/host.MODEL_OPT, -O1, by default)."""
    backends = ios_backends(backends, coreml)
    target = Target("ios", functools.partial(_compile_xcframework, model_opt=model_opt), _swift_layout,
                    prefix_soc="ios",
                    prefix_kwargs=(("name", prog.name), ("fp16", fp16)))
    return package(prog, backends, target, out)


def _compile_xcframework(step, source, cpp: Path, model_opt: str = MODEL_OPT) -> dict:
    """The written source as an XCFramework of static libraries (device + simulator slices)."""
    return {"xcframework": build_xcframework(cpp, cpp.parent / f"{swift_name(step.name)}.xcframework",
                                             f"libpock_{step.name}.a", model_opt)}


def _swift_layout(step, source, out: Path, libraries: dict, weights: Path, bundle: Path, prefix_entry) -> dict:
    """The Swift package over the XCFramework and the bundle."""
    return {"xcframework": libraries["xcframework"],
            "package": write_swift_package(out, step.name, libraries["xcframework"], bundle)}


# -- the model bundle -----------------------------------------------------------------

def export_prefix(prefix, prefix_dir: Path, name: str, fp16: bool) -> dict:
    """The prefix as prefix_dir/<name>_prefix.mlpackage (the registered "coreml" backend's
    export hook, backends/coreml.py); returns the manifest's "prefix" entry."""
    return get("coreml").export(prefix, Path(prefix_dir).parent, "ios", name=name, fp16=fp16)


# -- static libraries and the XCFramework ----------------------------------------------

def _xcode() -> bool:
    return platform.system() == "Darwin" and shutil.which("xcodebuild") is not None


def zig_lib_dir() -> Path:
    try:
        import ziglang
    except ImportError:
        raise PockError("--platform ios off macOS needs zig: pip install ziglang==0.17.1") from None
    return Path(ziglang.__file__).parent / "lib"


def _compiler(zig_target: str, arch: str) -> tuple[list[str], str]:
    """(compiler command, its id for the object cache) for one target."""
    if _xcode():
        sdk = "iphonesimulator" if zig_target.endswith("-simulator") else "iphoneos"
        env = "ios-simulator" if sdk == "iphonesimulator" else "ios"
        cmd = ["xcrun", "--sdk", sdk, "clang++", "-target", f"{arch}-apple-{env}{MIN_IOS}"]
        return cmd, " ".join(cmd)
    darwin_libc = zig_lib_dir() / "libc" / "include" / "any-darwin-any"
    cmd = [sys.executable, "-m", "ziglang", "c++", "-target", zig_target, "-isystem", str(darwin_libc)]
    return cmd, f"zig {_zig_version()} {zig_target}"


def _zig_version() -> str:
    r = subprocess.run([sys.executable, "-m", "ziglang", "version"], capture_output=True, text=True)
    if r.returncode != 0:
        raise PockError(f"zig does not run: {r.stderr.strip()[-2000:]}")
    return r.stdout.strip()


def compile_ios_objects(sources: list[Path], zig_target: str, arch: str, model_opt: str = MODEL_OPT) -> list[Path]:
    """Compile sources for one target (cached by content hash), in parallel; the model TU at
    model_opt, the runtime's at -O3."""
    rt = runtime_dir()
    flags = (*FLAGS, "-I", str(rt / "include"), "-I", str(rt))
    headers = _digest(sorted(rt.rglob("*.h")))
    cmd, compiler_id = _compiler(zig_target, arch)
    tu_flags = model_flags(flags, model_opt)  # as build/host.py: the glue at -O1 by default
    runtime = {Path(s).resolve() for s in runtime_sources()}
    jobs = [(src, flags if Path(src).resolve() in runtime else tu_flags, headers) for src in sources]
    return compile_objects(jobs, cmd, subdir=f"ios/{zig_target}",
                           what=f"iOS compilation ({zig_target})", compiler_id=compiler_id)


def static_library(objs: list[Path], out: Path) -> Path:
    """A Darwin static archive (with its symbol table) of objs."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    if _xcode():
        cmd = ["xcrun", "libtool", "-static", "-o", str(out), *map(str, objs)]
    else:
        cmd = [sys.executable, "-m", "ziglang", "ar", "--format=darwin", "rcsD", str(out), *map(str, objs)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise PockError(f"archiving {out.name} failed: {(r.stderr or r.stdout).strip()[-2000:]}")
    return out


def build_slice(model_cpp: Path, identifier: str, work: Path, lib_name: str, model_opt: str = MODEL_OPT) -> Path:
    """The static library of one XCFramework slice (universal when it has several CPUs)."""
    sources = [*runtime_sources(), Path(model_cpp).resolve()]
    thin = []
    for zig_target, arch, cpu in SLICES[identifier]:
        objs = compile_ios_objects(sources, zig_target, arch, model_opt)
        thin.append((cpu, static_library(objs, work / zig_target / lib_name)))
    lib = work / identifier / lib_name
    if len(thin) == 1:
        lib.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(thin[0][1], lib)
    elif _xcode():
        subprocess.run(["xcrun", "lipo", "-create", *(str(p) for _, p in thin), "-output", str(lib)], check=True)
    else:
        lib.parent.mkdir(parents=True, exist_ok=True)
        write_fat(lib, [(cpu, p.read_bytes()) for cpu, p in thin])
    return lib


def _headers(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(runtime_dir() / "include" / "pock.h", dest / "pock.h")
    (dest / "module.modulemap").write_text(MODULE_MAP)
    return dest


def build_xcframework(model_cpp: Path, xcf: Path, lib_name: str, model_opt: str = MODEL_OPT) -> Path:
    """<Model>.xcframework with an ios-arm64 and an ios-arm64_x86_64-simulator static library."""
    work = xcf.parent / "build-ios"
    libs = {ident: build_slice(model_cpp, ident, work, lib_name, model_opt) for ident in SLICES}
    shutil.rmtree(xcf, ignore_errors=True)
    if _xcode():
        headers = _headers(work / "Headers")
        cmd = ["xcodebuild", "-create-xcframework"]
        for lib in libs.values():
            cmd += ["-library", str(lib), "-headers", str(headers)]
        subprocess.run([*cmd, "-output", str(xcf)], check=True, capture_output=True)
        return xcf
    available = []
    for ident, lib in libs.items():
        (xcf / ident).mkdir(parents=True)
        shutil.copyfile(lib, xcf / ident / lib_name)
        _headers(xcf / ident / "Headers")
        entry = {"HeadersPath": "Headers", "LibraryIdentifier": ident, "LibraryPath": lib_name,
                 "SupportedArchitectures": [arch for _, arch, _ in SLICES[ident]], "SupportedPlatform": "ios"}
        if ident.endswith("-simulator"):
            entry["SupportedPlatformVariant"] = "simulator"
        available.append(entry)
    info = {"AvailableLibraries": available, "CFBundlePackageType": "XFWK", "XCFrameworkFormatVersion": "1.0"}
    with open(xcf / "Info.plist", "wb") as f:
        plistlib.dump(info, f)
    return xcf


# -- the Swift package --------------------------------------------------------------

def write_swift_package(out: Path, name: str, xcf: Path, bundle: Path) -> Path:
    """out/Package.swift: PockEngine (sdk-ios's Swift sources) over the XCFramework, and
    Pock<Model> holding the bundle as a resource.  Returns the package root (out)."""
    model = swift_name(name)
    engine = out / "Sources" / "PockEngine"
    shutil.rmtree(out / "Sources", ignore_errors=True)
    shutil.copytree(SDK_DIR / "Sources" / "PockEngine", engine)
    target = out / "Sources" / f"Pock{model}"
    shutil.copytree(bundle, target / "Resources" / f"{name}.pockmodel")
    (target / f"Pock{model}.swift").write_text(MODEL_SWIFT.format(model=model, name=name))
    (out / "Package.swift").write_text(PACKAGE_SWIFT.format(model=model, xcf=xcf.name, name=name))
    return out


PACKAGE_SWIFT = """// swift-tools-version:5.7
// Generated by pock-build --platform ios.  Add this folder to an Xcode project
// (File > Add Package Dependencies > Add Local) and `import Pock{model}`.
import PackageDescription

let package = Package(
    name: "Pock{model}",
    platforms: [.iOS(.v15)],
    products: [.library(name: "Pock{model}", targets: ["Pock{model}"])],
    targets: [
        // libpock_{name}.a: the compiled training step + runtime, C module PockC (pock.h)
        .binaryTarget(name: "{model}", path: "{xcf}"),
        .target(name: "PockEngine", dependencies: ["{model}"], path: "Sources/PockEngine",
                linkerSettings: [.linkedLibrary("c++"), .linkedFramework("CoreML")]),
        .target(name: "Pock{model}", dependencies: ["PockEngine"], path: "Sources/Pock{model}",
                resources: [.copy("Resources/{name}.pockmodel")]),
    ]
)
"""

MODEL_SWIFT = """// Generated by pock-build --platform ios: the {name} model bundle shipped in this package.
import Foundation
@_exported import PockEngine

public enum {model}Model {{
    /// The model bundle (model.json, weights.pockckpt, prefix/) inside this package.
    public static var bundleURL: URL {{
        Bundle.module.url(forResource: "{name}", withExtension: "pockmodel")!
    }}

    /// A trainer starting from the bundle's initial weights.
    public static func makeTrainer(options: PockTrainer.Options = .init()) throws -> PockTrainer {{
        try PockTrainer(modelURL: bundleURL, options: options)
    }}
}}
"""
