"""One vocabulary on every side (CONTRACT.md's table): every public member of the Kotlin
PockTrainer has its Swift twin, and both reach the same pock.h calls.  Swift cannot compile
here, so this is what keeps it one-to-one with the Kotlin SDK (whose JVM tests run).

Kotlin's C calls go through PockNative, whose JNI functions (pock_jni.cpp) call pock.h;
Swift calls pock.h directly.  Both sides are read from source: a public member's direct
calls (not through helpers) are compared as sets."""
import re
from pathlib import Path

from pockengine.codegen import RUNTIME_DIR
from pockengine.platforms.android import JNI_SOURCE, KOTLIN_CORE
from pockengine.platforms.ios import SDK_DIR

POCK_H = (RUNTIME_DIR / "include" / "pock.h").read_text()
DECLARED = set(re.findall(r"POCK_API\s+[\w\s\*]+?\b(pock_\w+)\s*\(", POCK_H))
STRUCTS = set(re.findall(r"typedef (?:struct|enum) (pock_\w+)", POCK_H))  # types, not calls
KOTLIN = (KOTLIN_CORE / "ai" / "pockengine" / "PockTrainer.kt").read_text()
SWIFT = (SDK_DIR / "Sources" / "PockEngine" / "PockTrainer.swift").read_text()

# Kotlin name -> Swift spelling (Swift's argument labels); the rest are spelled alike
SWIFT_NAME = {"getTensor": "tensor(named:", "save": "save(to:", "load": "load(from:", "exportAdapter": "exportAdapter(to:"}
# Kotlin-only members, each with where Swift has the same thing
PLATFORM = {
    "open": "init(modelURL:options:)",           # a Kotlin factory; Swift opens in init
    "nativeVersion": "pock_version via PockC",
    "bundle": "manifest", "modelName": "manifest.name", "inputs": "manifest.inputs",
    "targets": "manifest.targets", "outputs": "manifest.outputs",
    "isClosed": "PockError(.closed) on use", "strict": "Options.strict",
}
IGNORED_C = {"pock_last_error"}  # error reporting, on every path


def block(source: str, start: int) -> str:
    """A member's body from `start` (just after its name): the brace-matched block, or for an
    expression body (an "=" outside parentheses first: `fun f() = g()`, `var x = 1`) the text
    up to the next blank line."""
    depth, i = 0, start
    while i < len(source):
        c = source[i]
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif depth == 0 and c == "=" and source[i + 1] not in "=>" and source[i - 1] not in "!<>=":
            end = source.find("\n\n", i)
            return source[i:end if end != -1 else len(source)]
        elif depth == 0 and c == "{":
            break
        i += 1
    brace, depth = i, 0
    while i < len(source):
        depth += {"{": 1, "}": -1}.get(source[i], 0)
        if depth == 0:
            return source[brace:i + 1]
        i += 1
    return source[brace:]


def kotlin_members() -> dict[str, str]:
    """Public members of class PockTrainer (and its companion) -> their bodies (overloads joined)."""
    out = {}
    companion = KOTLIN.index("    companion object {")
    companion_end = companion + len(block(KOTLIN, companion))
    for m in re.finditer(r"^( {4}| {8})((?:@\w+(?:\(\w+\))? |override |suspend |private |internal )*)(?:fun|val|var) "
                         r"(?:<[^>]+> )?(\w+)", KOTLIN, re.M):
        if len(m.group(1)) == 8 and not companion < m.start() < companion_end:
            continue  # a local or a nested class's member
        if "private" in m.group(2) or "internal" in m.group(2) or m.group(3) == "toString":
            continue
        out[m.group(3)] = out.get(m.group(3), "") + block(KOTLIN, m.end())
    return out


def swift_members() -> dict[str, list[tuple[str, str]]]:
    """Public members of class PockTrainer -> [(signature line, body)] per overload."""
    cls = SWIFT[SWIFT.index("public final class PockTrainer"):]
    out = {}
    for m in re.finditer(r"^    public (?:private\(set\) )?(?:func|var|init)\s*(\w*)[^\n]*", cls, re.M):
        name = m.group(1) or "init"
        out.setdefault(name, []).append((m.group(0), block(cls, m.start() + len("    public ") + 4)))
    return out


def jni_calls() -> dict[str, set[str]]:
    """PockNative function -> the pock.h calls of its JNI implementation (with_path's callee included)."""
    src = JNI_SOURCE.read_text()
    out = {}
    for m in re.finditer(r"POCK_JNI\(\w+, (\w+)\)", src):
        body = block(src, m.end())
        out[m.group(1)] = {c for c in re.findall(r"\b(pock_\w+)\b", body) if c not in STRUCTS | IGNORED_C} & DECLARED
    return out


def c_of_kotlin(body: str, jni: dict[str, set[str]]) -> set[str]:
    return set().union(*(jni.get(n, set()) for n in re.findall(r"PockNative\.(\w+)\(", body)))


def c_of_swift(body: str) -> set[str]:
    return {c for c in re.findall(r"\b(pock_\w+)\(", body) if c not in STRUCTS | IGNORED_C}


def swift_twin(name: str, swift: dict) -> list:
    spelled = SWIFT_NAME.get(name, name)
    base, _, label = spelled.partition("(")
    return [(sig, body) for sig, body in swift.get(base, []) if not label or f"({label}" in sig or f"({label[:-1]} " in sig]


def test_every_public_kotlin_member_has_its_swift_twin_and_the_same_c_calls():
    kotlin, swift, jni = kotlin_members(), swift_members(), jni_calls()
    assert {"step", "forward", "save", "load", "getTensor", "setTensor", "lastStepStatus", "skippedSteps",
            "setLearningRate", "setNumThreads", "close", "train", "profile", "generate", "exportAdapter",
            "canGenerate"} <= set(kotlin)
    missing, differ = [], []
    for name, body in kotlin.items():
        if name in PLATFORM:
            continue
        twins = swift_twin(name, swift)
        if not twins:
            missing.append(f"{name} (Swift {SWIFT_NAME.get(name, name)})")
            continue
        k_calls = c_of_kotlin(body, jni)
        s_calls = set().union(*(c_of_swift(b) for _, b in twins))
        if k_calls != s_calls:
            differ.append(f"{name}: Kotlin {sorted(k_calls)} vs Swift {sorted(s_calls)}")
    assert not missing, f"Kotlin members without a Swift twin: {missing}"
    assert not differ, "Kotlin and Swift reach different C calls:\n" + "\n".join(differ)


def test_every_c_call_of_either_sdk_is_declared_and_both_cover_the_same_api():
    jni = jni_calls()
    kotlin_c = set().union(*jni.values())
    swift_c = c_of_swift("".join(p.read_text() for p in (SDK_DIR / "Sources" / "PockEngine").glob("*.swift")))
    assert kotlin_c <= DECLARED and swift_c <= DECLARED
    # each C entry point a trainer needs is reached from both SDKs (model name/hash: Kotlin checks the library)
    trainer_api = {c for c in DECLARED if c not in {"pock_last_error", "pock_version", "pock_model_name",
                                                    "pock_model_hash", "pock_io_count", "pock_io_info"}}
    trainer_api = {c for c in trainer_api
                   if not c.startswith("pock_tokenizer_")}  # PockTokenizer: tests/sdk_*/test_*tokenizer*
    assert trainer_api - kotlin_c == set(), f"pock.h calls the Kotlin SDK never makes: {trainer_api - kotlin_c}"
    assert trainer_api - swift_c == set(), f"pock.h calls the Swift SDK never makes: {trainer_api - swift_c}"


def test_the_contract_table_names_are_the_sdk_names():
    contract = Path("/work/shared/CONTRACT.md")
    kotlin, swift = kotlin_members(), swift_members()
    for k in ("step", "forward", "save", "load", "getTensor", "setTensor", "lastStepStatus", "skippedSteps", "close"):
        assert k in kotlin, k
    for s in ("step", "forward", "save", "load", "tensor", "setTensor", "lastStepStatus", "skippedSteps", "close"):
        assert s in swift, s
    assert "func save(to url: URL, trainedOnly: Bool" in SWIFT and "func load(from url: URL)" in SWIFT
    assert "func tensor(named name: String)" in SWIFT and "func setTensor(_ value: PockTensor, named name: String)" in SWIFT
    assert "func exportAdapter(to url: URL, format: String" in SWIFT and "fun exportAdapter(path: File, format: String" in KOTLIN
    assert "fun save(file: File, trainedOnly: Boolean = false)" in KOTLIN and "fun load(file: File)" in KOTLIN
    for old in ("predict", "restore", "runOn"):
        assert not re.search(rf"\b(fun|func) {old}\b", KOTLIN + SWIFT), old
    if contract.exists():  # the shared contract (not in every checkout)
        text = contract.read_text()
        assert "`save(file, trainedOnly = false)` / `load(file)`" in text
