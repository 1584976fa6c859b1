"""PockTokenizer (sdk-android/src/main/kotlin/ai/pockengine/PockTokenizer.kt + the
PockTokenizer block of pock_jni.cpp) on this machine's JVM over a host JNI build (the runtime's
tiny fixture model, which links the tokenizer like every model library): the SmolLM2
tokenizer encodes and decodes with the same ids as Python's pe.Tokenizer, and misuse is a
PockException naming the problem."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from pockengine.platforms import android
from shared_build import jvm_toolchain_missing, run_kotlin_main

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TINY = ROOT / "tests" / "native" / "runtime" / "fixtures" / "tiny_model.cpp"
TEXT = "Hello world 12345 héllo 日本語 🤖🎉 it's <|im_start|>user\nhi<|im_end|>\n\n  code(x) { return 1; }"

pytestmark = pytest.mark.skipif(bool(jvm_toolchain_missing()), reason=f"{jvm_toolchain_missing()}")


def test_kotlin_tokenizer_matches_python(tmp_path):
    sys.path.insert(0, str(ROOT / "tests" / "tokenizer"))
    from tok_corpora import smollm2_gguf

    import pockengine as pe
    gguf = smollm2_gguf()
    library = android.build_host_jni_library(TINY, tmp_path / "lib")
    core = android.kotlin_core_jar()
    jar = android.compile_kotlin([HERE / "TokenizerJvmTest.kt"], "tokenizer-jvm-test",
                                 classpath=[core, android.kotlin_stdlib()])
    text = tmp_path / "text.txt"
    text.write_text(TEXT, encoding="utf-8")
    facts = run_kotlin_main([core, jar], "TokenizerJvmTestKt", [gguf, library, text], "TokenizerJvmTest")
    ref = pe.Tokenizer.from_pretrained(gguf)
    assert facts["ids"].split() == [str(i) for i in ref.encode(TEXT)]
    assert facts["round_trip"] == "true"
    assert facts["vocab_size"] == "49152" and facts["specials"] == "1 2 2" and facts["im_start"] == "1"
    assert facts["error.out_of_vocab"].startswith("VALUE ") and "49152 at position 1" in facts["error.out_of_vocab"]
    assert facts["error.closed"].startswith("CLOSED ")
    assert facts["error.missing"].startswith("IO ") and "does not exist" in facts["error.missing"]
    assert facts["done"] == "true" and "WARNING in native method" not in facts["_stderr"]
    print(f"Kotlin PockTokenizer: {len(facts['ids'].split())} ids identical to pe.Tokenizer's")
