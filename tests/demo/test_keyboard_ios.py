"""The iOS keyboard demo's smart compose (demo-apps/keyboard/ios) cannot be compiled here (no
swiftc), so, as tests/sdk_ios does for the SDK, its sources are held to the Kotlin side's:
the Swift adapter implements every member of the shared Kotlin interfaces SmartCompose calls,
makes the same SDK calls as the Android app's PockLanguageModel.kt, with argument labels the
Swift SDK declares, and the keyboard extension / app call SmartCompose as the Android input
method / worker do, with the labels the Kotlin declarations export to Swift."""
from __future__ import annotations

import re
from pathlib import Path

from pockengine.platforms.ios import SDK_DIR

ROOT = Path(__file__).resolve().parents[2]
KEYBOARD = ROOT / "demo-apps" / "keyboard"
SHARED = (KEYBOARD / "shared" / "src" / "commonMain" / "kotlin" / "org" / "pockengine" / "keyboard")
APP = KEYBOARD / "android" / "app" / "src" / "main" / "kotlin" / "org" / "pockengine" / "keyboard" / "app"
SWIFT = (KEYBOARD / "ios" / "Common" / "SmartComposeEngine.swift").read_text()
ENGINE = (KEYBOARD / "ios" / "Common" / "KeyboardEngine.swift").read_text()
EXTENSION = (KEYBOARD / "ios" / "Extension" / "KeyboardViewController.swift").read_text()
KOTLIN_ADAPTER = (APP / "PockLanguageModel.kt").read_text() + (APP / "PockKeyboardModel.kt").read_text()
COMPOSE = (SHARED / "SmartCompose.kt").read_text()
SDK_SWIFT = "".join(p.read_text() for p in (SDK_DIR / "Sources" / "PockEngine").glob("*.swift"))

# the SDK calls both adapters make: (Kotlin, Swift)
SDK_CALLS = [("tokenizer.encode(", "tokenizer.encode("), ("tokenizer.decode(", "tokenizer.decode("),
             ("trainer().forward(", "trainer.forward("), ("trainer().step(", "trainer.step("),
             ("trainer().generate(", "trainer.generate("), ("trainer().exportAdapter(", "trainer.exportAdapter(")]


def interface_members(source: str, name: str) -> list[str]:
    """The function names declared in Kotlin interface `name` (its body, one level)."""
    m = re.search(r"interface\s+" + name + r"\b[^{]*\{", source)
    body, depth, i = [], 1, m.end()
    while depth:
        c = source[i]
        depth += {"{": 1, "}": -1}.get(c, 0)
        body.append(c)
        i += 1
    return re.findall(r"\bfun\s+(\w+)\s*\(", "".join(body))


def call_labels(code: str, start: str) -> list[list[str]]:
    """The argument labels of every call of `start` in Swift code (top-level `label:` only)."""
    out = []
    for m in re.finditer(re.escape(start), code):
        depth, i, arg = 1, m.end(), ""
        args = []
        while depth:
            c = code[i]
            depth += {"(": 1, ")": -1, "[": 1, "]": -1, "{": 1, "}": -1}.get(c, 0)
            if depth == 1 and c == ",":
                args.append(arg)
                arg = ""
            elif depth >= 1:
                arg += c
            i += 1
        args.append(arg[:-1] if arg.endswith(")") else arg)
        out.append([a.split(":")[0].strip() for a in args if re.match(r"\s*\w+\s*:", a)])
    return out


def swift_signatures(name: str) -> list[list[str]]:
    """The argument labels of each public Swift SDK func/init `name` (`_` for unlabeled)."""
    out = []
    for m in re.finditer(r"public (?:convenience )?(?:func )?" + re.escape(name) + r"\(", SDK_SWIFT):
        depth, i, params, cur = 1, m.end(), [], ""
        while depth:
            c = SDK_SWIFT[i]
            depth += {"(": 1, ")": -1}.get(c, 0)
            if depth == 1 and c == ",":
                params.append(cur)
                cur = ""
            elif depth >= 1:
                cur += c
            i += 1
        params.append(cur[:-1])
        out.append([p.strip().split(":")[0].split()[0] for p in params if p.strip()])
    return out


def test_the_swift_adapter_implements_the_shared_interfaces():
    wanted = {n for i in ("TextTokenizer", "LanguageModel") for n in interface_members(COMPOSE, i)}
    wanted |= set(interface_members((SHARED / "SuggestionRanker.kt").read_text(), "NextWordModel"))
    wanted |= set(interface_members((SHARED / "TrainingPolicy.kt").read_text(), "StepTrainer"))
    assert wanted == {"encode", "decode", "generate", "exportAdapter", "nextLogits", "step"}
    assert "class Model: TextTokenizer, LanguageModel" in SWIFT
    for name in wanted:
        assert re.search(r"\bfunc " + name + r"\(", SWIFT), f"the Swift adapter lacks {name}"
        assert re.search(r"override fun " + name + r"\(", KOTLIN_ADAPTER), f"PockLanguageModel.kt lacks {name}"


def test_both_adapters_make_the_same_sdk_calls_with_declared_labels():
    for kotlin, swift in SDK_CALLS:
        assert kotlin in KOTLIN_ADAPTER, kotlin
        assert swift in SWIFT, swift
        member = swift.split(".")[1][:-1]
        declared = swift_signatures(member)
        assert declared, f"the Swift SDK declares no public {member}"
        for labels in call_labels(SWIFT, swift):
            assert any(all(lab in sig for lab in labels) and [s for s in sig if s in labels] == labels
                       for sig in declared), f"{swift} with labels {labels}: the SDK declares {declared}"
    # tokenizer.json of the model bundle, special tokens off on both sides; greedy with the streaming stop
    assert "addSpecialTokens = false" in KOTLIN_ADAPTER and "addSpecialTokens: false" in SWIFT
    assert "onToken = onToken" in KOTLIN_ADAPTER and "onToken: {" in SWIFT
    assert "PockTokenizer(contentsOf:" in SWIFT


def test_the_apps_call_smart_compose_alike():
    service = (APP / "KeyboardService.kt").read_text()
    worker = (APP / "TrainWorker.kt").read_text()
    app = (APP / "KeyboardApp.kt").read_text()
    # suggest in the input method / extension, learn + flush after a training session, both strips
    assert "smartCompose?.suggest(line)" in service and "compose.suggest(before)" in EXTENSION
    assert "compose.suggest(textBeforeCursor: textBeforeCursor, k: 3)" in SWIFT
    assert "compose.learn(it)" in worker and "compose.flush()" in worker
    assert "compose.learn(sentence: s)" in SWIFT and "compose.flush()" in SWIFT
    assert "smartCompose?.learn(fresh)" in ENGINE and "untrainedSentences()" in ENGINE and "untrainedSentences()" in worker
    assert "SmartCompose(lm, lm, seq)" in app
    # the labels Swift sees are the Kotlin parameter names
    ctor = re.search(r"class SmartCompose\(([^)]*)\)", COMPOSE).group(1)
    params = re.findall(r"(?:val\s+)?(\w+)\s*:", ctor)
    assert call_labels(SWIFT, "SmartCompose(") == [params]
    for fun, labels in (("suggest", ["textBeforeCursor", "k"]), ("learn", ["sentence"])):
        declared = re.search(r"fun " + fun + r"\(([^)]*)\)", COMPOSE).group(1)
        assert re.findall(r"(\w+)\s*:", declared) == labels
        assert call_labels(SWIFT, "compose." + fun + "(") == [labels]
