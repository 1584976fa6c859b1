"""`pock-build --platform android`: an AAR holding the Kotlin SDK, the model's
native library per ABI and the model bundle.

    build_android(prog, out, soc="sm8550", abis=["arm64-v8a"], cxx=None)

writes into out/

    pockengine-<name>.aar       classes.jar (sdk-android's core Kotlin and its android classes PockAssets and
                                PockTrainingWorker, compiled with kotlinc against stubs of the android
                                types they use, src/androidStubs, which stay out of the AAR),
                                jni/<abi>/libpock_<name>.so, assets/pockengine/<name>/ (the bundle),
                                AndroidManifest.xml (minSdk 24), R.txt, proguard.txt, aar-metadata
    pockengine-<name>.pom       Maven coordinates + the kotlin-stdlib dependency
    consume.gradle.kts          how an app adds the AAR
    <name>.cpp, summary.md, bundle/, jni/<abi>/   the generated source, the summary and the loose files

The natives are the generated model TU + the runtime + sdk-android's JNI file,
built with the Android NDK's clang (found via ANDROID_NDK_HOME,
ANDROID_NDK_ROOT, or the newest ANDROID_HOME|ANDROID_SDK_ROOT/ndk/*) for API
level MIN_SDK with the SoC's -march, or with `cxx` (any aarch64 C++ compiler,
arm64-v8a only: the tests use aarch64-linux-gnu-g++).  Natives that need glibc (a GNU
`cxx`) cannot load on Android: the build says so loudly on stderr and the AAR's manifest
records it (<meta-data ai.pockengine.native_libc = glibc>), so an app build can refuse it.  Objects are cached by
content hash under $POCK_CACHE_DIR/android like build/host.py's.

The bundle's initial weights come from building the program for this host
once (prog.build_cpu(), cached) and saving them with pock_save.

Kotlin: kotlinc from $KOTLINC or .tools/node_modules/kotlin-compiler (make
setup), run with $JAVA_HOME or JDK 17.  kotlin_core_jar() and
build_host_jni_library() are also what the JVM test of the SDK uses.
"""
from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import zipfile
from pathlib import Path
from typing import Sequence

from ..build.host import ROOT, _compiler_id, _digest, _locked, _produce, build_shared_library, cache_dir, content_key, \
    MODEL_OPT, compile_objects, model_flags, runtime_dir, runtime_sources
from ..backends import check_backends, get, registered, split_roles
from ..build.package import Target, package, write_initial_bundle  # noqa: F401  (tests/sdk_android's JVM models)
from ..errors import PockError
from .socs import Soc, get_soc

SDK_DIR = ROOT / "sdk-android"
KOTLIN_CORE = SDK_DIR / "src" / "main" / "kotlin"
KOTLIN_ANDROID = SDK_DIR / "src" / "android" / "kotlin"   # PockAssets, PockTrainingWorker (android.* / androidx.work)
# QnnPrefixRunner needs ONNX Runtime's Android AAR (not here): shipped as source only, not in classes.jar
KOTLIN_ANDROID_SOURCE_ONLY = ("QnnPrefixRunner.kt",)
ANDROID_STUBS = SDK_DIR / "src" / "androidStubs" / "java"  # compile-time stubs of those android types, never shipped
JNI_SOURCE = SDK_DIR / "src" / "main" / "cpp" / "pock_jni.cpp"
EXPORT_MAP = JNI_SOURCE.parent / "exports.map"  # linker version script: only pock.h and the JNI entry points
MIN_SDK = 24
GROUP, VERSION = "ai.pockengine", "0.1.0"
KOTLIN_API = "2.2"  # -language-version/-api-version: readable by Kotlin 2.1+ apps; stdlib 2.2 in the POM
COROUTINES = ("org.jetbrains.kotlinx", "kotlinx-coroutines-core", "1.8.0")  # the version kotlinc ships
KOTLIN_FLAGS = ("-jvm-target", "1.8", "-language-version", KOTLIN_API, "-api-version", KOTLIN_API)
ABIS = {  # ABI -> (clang target triple, -march flags; arm64's come from the SoC)
    "arm64-v8a": ("aarch64-linux-android", None),
    "armeabi-v7a": ("armv7a-linux-androideabi", ("-march=armv7-a", "-mfpu=neon", "-mfloat-abi=softfp", "-mthumb")),
    "x86_64": ("x86_64-linux-android", ("-march=x86-64", "-msse4.2", "-mpopcnt")),
}
BASE_FLAGS = ("-O3", "-std=c++17", "-fPIC", "-fvisibility=hidden", "-ffunction-sections", "-fdata-sections")
# static C++ runtime kept private (one library, no libc++_shared.so to ship, only pock_* and JNI symbols
# exported), 16 KiB pages (Android 15), no undefined symbols
LINK_FLAGS = ("-shared", "-static-libstdc++", "-Wl,--exclude-libs,ALL", "-Wl,--no-undefined", "-Wl,--gc-sections",
              "-Wl,-z,max-page-size=16384")


# ----------------------------------------------------------------------------- entry point
def build_android(prog, out, soc: str = "generic-arm64", abis: Sequence[str] = ("arm64-v8a",), cxx: str | None = None,
                  backends=None, spec=None, model_opt: str = MODEL_OPT) -> dict:
    """Build the AAR and its companions in out/; returns {label: path}.  model_opt: the model
    TU's optimisation level (build/host.MODEL_OPT, -O1, by default)."""
    soc_info = get_soc(soc)
    abis = list(dict.fromkeys(abis or [soc_info.abi]))
    unknown = [a for a in abis if a not in ABIS]
    if unknown:
        raise PockError(f"unknown Android ABI(s) {unknown}; known: {', '.join(ABIS)}")
    backends = check_backends(backends)
    prefix_backend, step_backends = split_roles(backends)
    if step_backends != ["cpu"] or any("android" not in get(b).platforms for b in backends):
        prefixes = [b.name for b in registered() if b.role == "prefix" and "android" in b.platforms]
        others = [b for b in backends if "android" not in get(b).platforms]  # the ones asked for
        raise PockError(f"--platform android builds the step for cpu, optionally with the frozen prefix on "
                        f"{' or '.join(prefixes)}; got --backends {','.join(backends)} "
                        f"({', '.join(others)} on Android is not wired in this version)")
    if prefix_backend is not None and prefix_backend.check_target is not None:
        prefix_backend.check_target(soc_info)
    toolchains = {abi: _toolchain(abi, soc_info, cxx) for abi in abis}  # fails early: no NDK, bad --cxx

    def compile_abis(step, source, cpp: Path) -> dict:
        libs = {}
        for abi, (tool, flags) in toolchains.items():
            lib = build_native_library(cpp, tool, flags, f"libpock_{step.name}.so", model_opt)
            dest = cpp.parent / "jni" / abi / f"libpock_{step.name}.so"
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(lib, dest)
            libs[abi] = dest
        glibc = sorted(abi for abi, lib in libs.items() if links_glibc(lib))
        if glibc:
            warn_glibc_build(glibc, cxx)
        return libs

    target = Target("android", compile_abis, _aar_layout, prefix_soc=soc_info.name, require_prefix=True)
    return package(prog, backends, target, out)


def _aar_layout(step, source, out: Path, libs: dict, weights: Path, bundle: Path, prefix_entry) -> dict:
    """The AAR (classes, the ABIs' libraries, the bundle as assets), its POM and a Gradle snippet."""
    name = step.name
    aar = out / f"pockengine-{name}.aar"
    write_aar(aar, name, aar_classes_jar(), libs, bundle, test_build=any(links_glibc(lib) for lib in libs.values()))
    pom = out / f"pockengine-{name}.pom"
    pom.write_text(pom_xml(name, qnn=prefix_entry is not None))
    snippet = out / "consume.gradle.kts"
    snippet.write_text(gradle_snippet(name, aar.name))
    return {"aar": aar, "pom": pom, "gradle": snippet, **{f"jni:{abi}": path for abi, path in libs.items()}}


# ----------------------------------------------------------------------------- toolchains
def find_ndk() -> Path | None:
    """The Android NDK: ANDROID_NDK_HOME, ANDROID_NDK_ROOT, else the newest ndk/* of the SDK."""
    for var in ("ANDROID_NDK_HOME", "ANDROID_NDK_ROOT"):
        if os.environ.get(var) and Path(os.environ[var]).is_dir():
            return Path(os.environ[var])
    for var in ("ANDROID_HOME", "ANDROID_SDK_ROOT"):
        if os.environ.get(var):
            versions = sorted((p for p in (Path(os.environ[var]) / "ndk").glob("*") if p.is_dir()),
                              key=lambda p: [int(x) if x.isdigit() else 0 for x in p.name.split(".")])
            if versions:
                return versions[-1]
    return None


def ndk_clang(ndk: Path) -> Path:
    prebuilt = ndk / "toolchains" / "llvm" / "prebuilt"
    hosts = sorted(prebuilt.glob("*/bin/clang++")) if prebuilt.is_dir() else []
    if not hosts:
        raise PockError(f"the Android NDK at {ndk} has no toolchains/llvm/prebuilt/*/bin/clang++; "
                        "install NDK r23 or newer (Android Studio: SDK Manager > SDK Tools > NDK)")
    return hosts[0]


def _toolchain(abi: str, soc: Soc, cxx: str | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(compiler command, target flags) for one ABI."""
    triple, abi_flags = ABIS[abi]
    if cxx:
        if abi != "arm64-v8a":
            raise PockError(f"--cxx builds arm64-v8a only (it is an aarch64 compiler); drop --abi {abi} or use the NDK")
        tool = tuple(shlex.split(cxx))
        if shutil.which(tool[0]) is None:
            raise PockError(f"--cxx {cxx!r}: compiler not found")
        _compiler_id(tool)
        return tool, (f"-march={_supported_march(tool, soc)}", "-pthread")
    ndk = find_ndk()
    if ndk is None:
        raise PockError("--platform android needs the Android NDK to build the natives: install it "
                        "(Android Studio: SDK Manager > SDK Tools > NDK (Side by side), or sdkmanager 'ndk;27.2.12479018') "
                        "and set ANDROID_NDK_HOME to it (or ANDROID_HOME to the SDK holding ndk/), "
                        "or pass --cxx PATH to build arm64-v8a with another aarch64 C++ compiler")
    tool = (str(ndk_clang(ndk)), f"--target={triple}{MIN_SDK}")
    return tool, (f"-march={soc.march}",) if abi == "arm64-v8a" else abi_flags


def _supported_march(tool: tuple[str, ...], soc: Soc) -> str:
    """The SoC's -march, or (for an older compiler without it, e.g. GCC 12 and armv9.2-a)
    ARMv8.2-A with the same extensions."""
    fallback = "+".join(["armv8.2-a", *soc.features])
    for march in (soc.march, fallback):
        r = subprocess.run([*tool, f"-march={march}", "-x", "c++", "-fsyntax-only", "-"], input="int x;\n",
                           capture_output=True, text=True)
        if r.returncode == 0:
            return march
    raise PockError(f"{' '.join(tool)} accepts neither -march={soc.march} nor -march={fallback}: {r.stderr.strip()}")


# ----------------------------------------------------------------------------- natives
def build_native_library(model_cpp: Path, tool: tuple[str, ...], target_flags: tuple[str, ...], soname: str,
                         model_opt: str = MODEL_OPT) -> Path:
    """Compile the model TU (at model_opt), the runtime, the kernels and pock_jni.cpp with
    `tool` and link them into one shared library (cached); returns its cache path."""
    rt = runtime_dir()
    flags = (*BASE_FLAGS, *target_flags, "-I", str(rt / "include"), "-I", str(rt))
    headers = _digest(sorted(rt.rglob("*.h")))
    model_cpp = Path(model_cpp).resolve()
    jobs = [(src, flags, headers) for src in runtime_sources()]
    tu_flags = model_flags(flags, model_opt)  # as build/host.py: the glue at -O1 by default
    jobs.append((model_cpp, (*tu_flags, "-I", str(model_cpp.parent)), headers))
    jobs.append((JNI_SOURCE, (*flags, *_jni_include_flags(tool)), headers))
    objs = compile_objects(jobs, tool, subdir="android/obj", what="C++ compilation (android)")
    paths = [str(o) for o in objs]
    link = (*target_flags, *LINK_FLAGS, f"-Wl,--version-script={EXPORT_MAP}", f"-Wl,-soname,{soname}")
    if "android" not in " ".join(tool):
        link += ("-static-libgcc", "-lm")  # a GNU toolchain: only libc/libm/libpthread stay dynamic
    key = hashlib.sha256("\0".join([*tool, *content_key(objs), *link, EXPORT_MAP.read_text()]).encode()).hexdigest()[:24]
    return _produce(cache_dir() / "android" / "lib" / f"{Path(soname).stem}-{key}.so",
                    lambda tmp: [*tool, *paths, *link, "-o", str(tmp)], "linking (android)")


def links_glibc(lib: Path) -> bool:
    """Whether a native library needs glibc (libc.so.6: a GNU toolchain's --cxx build), which
    Android's bionic loader cannot satisfy: its dynamic string table names libc.so.6."""
    return b"libc.so.6\0" in Path(lib).read_bytes()


GLIBC_MARKER = "ai.pockengine.native_libc"  # the AAR manifest's <meta-data> naming the natives' C library


def warn_glibc_build(abis: Sequence[str], cxx: str | None) -> None:
    """The loud build-time notice of an AAR whose natives cannot load on Android."""
    import sys
    bar = "!" * 78
    print(f"{bar}\npock-build: WARNING: TEST ARTIFACT, NOT FOR ANDROID\n"
          f"  the natives for {', '.join(abis)} were built with --cxx {cxx} against glibc (they need libc.so.6\n"
          f"  and libm.so.6); Android's bionic loader cannot load them, so this AAR fails on every device.\n"
          f"  Its AndroidManifest.xml records <meta-data android:name=\"{GLIBC_MARKER}\" android:value=\"glibc\"/>\n"
          f"  so an app build can refuse it.  Build with the Android NDK (ANDROID_NDK_HOME) for a real AAR.\n{bar}",
          file=sys.stderr, flush=True)


def _jni_include_flags(tool: tuple[str, ...]) -> tuple[str, ...]:
    """The NDK's sysroot has jni.h; any other compiler gets the JDK's (the same JNI ABI on Linux)."""
    if "android" in " ".join(tool):
        return ()
    inc = java_home() / "include"
    return ("-I", str(inc), "-I", str(inc / "linux"))


def build_host_jni_library(model_cpp: Path, out_dir: Path) -> Path:
    """The model TU + runtime + pock_jni.cpp for this machine (build/host.py), for
    running the Kotlin SDK on the JVM.  pock_jni.cpp is staged beside the JDK's
    jni.h so only its own object depends on the JDK; the runtime objects are
    the ones every host build shares."""
    inc = java_home() / "include"
    stage = cache_dir() / "android" / ("jni-src-" + _digest([JNI_SOURCE, inc / "jni.h", inc / "linux" / "jni_md.h"])[:16])
    if not (stage / "pock_jni.cpp").exists():
        stage.mkdir(parents=True, exist_ok=True)
        for src in (inc / "jni.h", inc / "linux" / "jni_md.h", JNI_SOURCE):
            tmp = stage / f".{src.name}.tmp-{os.getpid()}"
            shutil.copyfile(src, tmp)
            os.replace(tmp, stage / src.name)
    return build_shared_library([Path(model_cpp), stage / "pock_jni.cpp"], out_dir)


# ----------------------------------------------------------------------------- Kotlin
def java_home() -> Path:
    home = Path(os.environ.get("JAVA_HOME") or "/usr/lib/jvm/java-17-openjdk-amd64")
    if not (home / "bin" / "java").exists() or not (home / "include" / "jni.h").exists():
        raise PockError(f"no JDK at {home} (needs bin/java and include/jni.h): install JDK 17 and set JAVA_HOME")
    return home


def kotlinc() -> Path:
    path = Path(os.environ.get("KOTLINC") or ROOT / ".tools" / "node_modules" / "kotlin-compiler" / "bin" / "kotlinc")
    if not path.exists():
        raise PockError(f"kotlinc not found at {path}: run `make setup` (npm kotlin-compiler) or set KOTLINC")
    return path


def kotlin_stdlib() -> Path:
    """kotlin-stdlib.jar of the kotlinc in use (to run compiled Kotlin on a plain JVM)."""
    lib = kotlinc().resolve().parents[1] / "lib" / "kotlin-stdlib.jar"
    if not lib.exists():
        raise PockError(f"{lib} does not exist; is {kotlinc()} a full Kotlin compiler distribution?")
    return lib


def compile_kotlin(sources: Sequence[Path], name: str, classpath: Sequence[Path] = ()) -> Path:
    """kotlinc sources (+ classpath jars) into a cached jar named <name>-<key>.jar."""
    sources = sorted(Path(s).resolve() for s in sources)
    h = hashlib.sha256()
    for part in (str(kotlinc().resolve()), " ".join(KOTLIN_FLAGS), *map(str, classpath)):
        h.update(part.encode() + b"\0")
    for p in [*sources, *map(Path, classpath)]:
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    jar = cache_dir() / "kotlin" / f"{name}-{h.hexdigest()[:24]}.jar"
    if jar.exists():
        return jar
    cp = ["-classpath", os.pathsep.join(map(str, classpath))] if classpath else []
    env = {**os.environ, "JAVA_HOME": str(java_home())}
    with _locked(jar):
        if not jar.exists():
            tmp = jar.with_name(f"{jar.stem}.tmp-{os.getpid()}.jar")  # kotlinc writes a jar when -d ends in .jar
            try:
                r = subprocess.run([str(kotlinc()), *map(str, sources), *cp, *KOTLIN_FLAGS, "-module-name", name,
                                    "-d", str(tmp)], capture_output=True, text=True, env=env)
                if r.returncode != 0 or not tmp.exists():
                    raise PockError(f"kotlinc failed (exit {r.returncode}):\n{(r.stderr or r.stdout)[-4000:]}")
                os.replace(tmp, jar)
            finally:
                tmp.unlink(missing_ok=True)
    return jar


def kotlin_coroutines() -> Path:
    """kotlinx-coroutines-core of the kotlinc in use: PockTrainer.train checks cancellation with it
    (apps have it; the POM declares COROUTINES)."""
    lib = kotlinc().resolve().parents[1] / "lib" / "kotlinx-coroutines-core-jvm.jar"
    if not lib.exists():
        raise PockError(f"{lib} does not exist; is {kotlinc()} a full Kotlin compiler distribution?")
    return lib


def kotlin_core_jar() -> Path:
    """sdk-android's core API (src/main/kotlin: no android.*) compiled: the AAR's classes.jar."""
    return compile_kotlin(sorted(KOTLIN_CORE.rglob("*.kt")), "pockengine", classpath=[kotlin_coroutines()])


def compile_java(sources: Sequence[Path], name: str) -> Path:
    """javac sources into a cached jar named <name>-<key>.jar (Java 8 bytecode)."""
    sources = sorted(Path(s).resolve() for s in sources)
    h = hashlib.sha256(str(java_home()).encode())
    for p in sources:
        h.update(str(p).encode() + b"\0" + p.read_bytes())
    jar = cache_dir() / "java" / f"{name}-{h.hexdigest()[:24]}.jar"
    if jar.exists():
        return jar
    jar.parent.mkdir(parents=True, exist_ok=True)
    with _locked(jar):
        if not jar.exists():
            classes = jar.with_name(f"{jar.stem}.classes-{os.getpid()}")
            try:
                r = subprocess.run([str(java_home() / "bin" / "javac"), "--release", "8", "-nowarn", "-d", str(classes),
                                    *map(str, sources)], capture_output=True, text=True)
                if r.returncode != 0:
                    raise PockError(f"javac failed (exit {r.returncode}):\n{(r.stderr or r.stdout)[-4000:]}")
                tmp = jar.with_name(f"{jar.stem}.tmp-{os.getpid()}.jar")
                with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
                    for f in sorted(classes.rglob("*.class")):
                        z.write(f, f.relative_to(classes).as_posix())
                os.replace(tmp, jar)
            finally:
                shutil.rmtree(classes, ignore_errors=True)
    return jar


def android_stubs_jar() -> Path:
    """The compile-time stubs of android.* / androidx.work (src/androidStubs): never shipped."""
    return compile_java(sorted(ANDROID_STUBS.rglob("*.java")), "pockengine-android-stubs")


def kotlin_android_jar() -> Path:
    """sdk-android's android source set (PockAssets, PockTrainingWorker) compiled against the core
    jar and the android stubs; holds only ai/pockengine/android/ classes."""
    sources = [p for p in sorted(KOTLIN_ANDROID.rglob("*.kt")) if p.name not in KOTLIN_ANDROID_SOURCE_ONLY]
    return compile_kotlin(sources, "pockengine-android",
                          classpath=[kotlin_core_jar(), android_stubs_jar(), kotlin_coroutines(), kotlin_stdlib()])


def aar_classes_jar() -> Path:
    """The AAR's classes.jar: the core API and the android classes (ai/pockengine/**), no stub."""
    parts = [kotlin_core_jar(), kotlin_android_jar()]
    key = hashlib.sha256(b"".join(p.read_bytes() for p in parts)).hexdigest()[:24]
    jar = cache_dir() / "kotlin" / f"pockengine-classes-{key}.jar"
    if jar.exists():
        return jar
    tmp = jar.with_name(f"{jar.stem}.tmp-{os.getpid()}.jar")
    seen = set()
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
        for part in parts:
            with zipfile.ZipFile(part) as z:
                for info in z.infolist():
                    keep = info.filename.startswith("ai/pockengine/") or info.filename.startswith("META-INF/")
                    if keep and info.filename not in seen:
                        seen.add(info.filename)
                        out.writestr(info, z.read(info.filename))
    os.replace(tmp, jar)
    return jar


# ----------------------------------------------------------------------------- AAR
def write_aar(aar: Path, name: str, classes_jar: Path, libs: dict[str, Path], bundle_dir: Path,
              test_build: bool = False) -> Path:
    """Zip the AAR (fixed timestamps: the same inputs give the same bytes), atomically.
    test_build: the natives need glibc (a --cxx build); the manifest says so."""
    entries = {
        "AndroidManifest.xml": android_manifest(name, test_build).encode(),
        "classes.jar": classes_jar.read_bytes(),
        "R.txt": b"",
        "proguard.txt": CONSUMER_RULES.encode(),
        "META-INF/com/android/build/gradle/aar-metadata.properties":
            b"aarFormatVersion=1.0\naarMetadataVersion=1.0\nminCompileSdk=1\nminAndroidGradlePluginVersion=1.0.0\n",
    }
    for abi, lib in libs.items():
        entries[f"jni/{abi}/{lib.name}"] = lib.read_bytes()
    for f in sorted(bundle_dir.rglob("*")):  # model.json, weights, and prefix/ when the bundle has one
        if f.is_file():
            entries[f"assets/pockengine/{name}/{f.relative_to(bundle_dir).as_posix()}"] = f.read_bytes()
    tmp = aar.with_name(f".{aar.name}.tmp-{os.getpid()}")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in entries.items():
            info = zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    os.replace(tmp, aar)
    return aar


def android_manifest(name: str, test_build: bool = False) -> str:
    """The AAR's manifest; a test build (glibc natives) carries GLIBC_MARKER = "glibc" so an app
    build can refuse it (a real build says "bionic")."""
    package = f"{GROUP}.{''.join(c if c.isalnum() else '_' for c in name.lower())}"
    libc = "glibc" if test_build else "bionic"
    note = ("\n    <!-- TEST ARTIFACT: natives built with --cxx against glibc; they cannot load on Android -->"
            if test_build else "")
    return f"""<?xml version="1.0" encoding="utf-8"?>
<manifest xmlns:android="http://schemas.android.com/apk/res/android" package="{package}">
    <uses-sdk android:minSdkVersion="{MIN_SDK}" />{note}
    <application>
        <meta-data android:name="{GLIBC_MARKER}" android:value="{libc}" />
    </application>
</manifest>
"""


# The JNI layer calls PockNative's natives and PockException(int, String) by name.
CONSUMER_RULES = """# PockEngine: JNI entry points and the exception the native code constructs
-keep class ai.pockengine.PockNative { native <methods>; }
-keep class ai.pockengine.PockException { <init>(int, java.lang.String); }
-keepclassmembers class ai.pockengine.PockStatus { *; }
"""


ORT_QNN = ("com.microsoft.onnxruntime", "onnxruntime-android-qnn", "1.22.0")


def pom_xml(name: str, qnn: bool = False) -> str:
    ort = "" if not qnn else f"""
    <dependency>
      <groupId>{ORT_QNN[0]}</groupId>
      <artifactId>{ORT_QNN[1]}</artifactId>
      <version>{ORT_QNN[2]}</version>
      <scope>runtime</scope>
    </dependency>"""
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
         xsi:schemaLocation="http://maven.apache.org/POM/4.0.0 https://maven.apache.org/xsd/maven-4.0.0.xsd">
  <modelVersion>4.0.0</modelVersion>
  <groupId>{GROUP}</groupId>
  <artifactId>pockengine-{name}</artifactId>
  <version>{VERSION}</version>
  <packaging>aar</packaging>
  <description>PockEngine on-device training for model '{name}' (generated by pock-build)</description>
  <dependencies>
    <dependency>
      <groupId>org.jetbrains.kotlin</groupId>
      <artifactId>kotlin-stdlib</artifactId>
      <version>{KOTLIN_API}.0</version>
      <scope>runtime</scope>
    </dependency>
    <dependency>
      <groupId>{COROUTINES[0]}</groupId>
      <artifactId>{COROUTINES[1]}</artifactId>
      <version>{COROUTINES[2]}</version>
      <scope>runtime</scope>
    </dependency>{ort}
  </dependencies>
</project>
"""


def gradle_snippet(name: str, aar_name: str) -> str:
    return f"""// Add PockEngine's '{name}' model to an Android app (module build.gradle.kts).
// Copy {aar_name} to app/libs/, then:
dependencies {{
    implementation(files("libs/{aar_name}"))
    implementation("org.jetbrains.kotlin:kotlin-stdlib:{KOTLIN_API}.0")
    implementation("{':'.join(COROUTINES)}")
}}
// Or install it into a Maven repository with its POM:
//   mvn install:install-file -Dfile={aar_name} -DpomFile=pockengine-{name}.pom
// and use implementation("{GROUP}:pockengine-{name}:{VERSION}") with mavenLocal().
//
// The bundle is in the AAR's assets at pockengine/{name}/; on the device:
//   val dir = PockAssets.extract(context, "{name}")   // sdk-android's android source set, or copy
//   PockTrainer.open(dir).use {{ trainer -> trainer.step(x, y) }}
"""
