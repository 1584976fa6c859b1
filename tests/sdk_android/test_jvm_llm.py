"""The LLM loop of the Kotlin SDK (issue 37) on this machine's JVM, over a host JNI build of a
tiny Llama with LoRA adapters and a byte-level BPE trained here: PockTokenizer.encode -> step
-> generate -> exportAdapter (LlmJvmTest.kt), each judged against Python's trainer driven
through the same steps from the same bundle: the same ids, losses, greedy / streamed /
stopped / sampled tokens, and the same PEFT and GGUF adapter files.  A batch whose every label is ignored is
skipped and counted (strict or not) and moves nothing; misuse is a PockException naming it."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

import pockengine as pe
from pockengine.platforms import android
from shared_build import build_jvm_model, jvm_toolchain_missing, run_kotlin_main, run_once

HERE = os.path.dirname(os.path.abspath(__file__))
TEXT = " ".join(["the licensee may copy the program and distribute it under the terms of this license",
                 "you may charge a fee for the physical act of transferring a copy of the program",
                 "the program is distributed in the hope that it will be useful but without any warranty"] * 3)
PROMPT, SEQ = "the program is", 24
# q and k (4 and 2 heads): llama.cpp's rotary row order in the GGUF; o and down: no permutation
LORA_TARGETS = ["*.q_proj", "*.k_proj", "*.v_proj", "*.o_proj", "*.down_proj"]

pytestmark = pytest.mark.skipif(bool(jvm_toolchain_missing()), reason=f"{jvm_toolchain_missing()}")


def tiny_llm(out):
    """(tokenizer.json path, pe.Tokenizer, the compiled tiny Llama with LoRA on LORA_TARGETS)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator([TEXT], trainers.BpeTrainer(vocab_size=300,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path = out / "tokenizer.json"
    bpe.save(str(path))
    tok = pe.Tokenizer.from_pretrained(str(path))
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=64, eos_token_id=None, bos_token_id=None,
                                         pad_token_id=None)).train()
    ids = torch.tensor([tok.encode(TEXT)[:SEQ + 1]])
    prog = pe.compile(model, (ids[:, :-1],), (ids[:, 1:],), output="logits", update="none",
                      optimizer=pe.AdamW(lr=2e-2), lora=pe.LoRA(rank=4, alpha=8, targets=LORA_TARGETS),
                      name="llmjvm")
    return path, tok, prog


def _python_side(prog, bundle, tok, out):
    """Python's trainer through the same steps (without the skipped batch): what Kotlin must match."""
    ids = tok.encode(TEXT)[:SEQ + 1]
    x, y = np.array([ids[:-1]], np.int64), np.array([ids[1:]], np.int64)
    prompt = tok.encode(PROMPT)
    tr = prog.build()
    tr.load(bundle / "weights.pockckpt")
    ref = {"ids": ids, "prompt": prompt, "greedy_before": tr.generate(prompt, max_new_tokens=12)}
    ref["losses"] = [float(tr.step((x,), (y,))) for _ in range(5)]
    ref["greedy"] = tr.generate(prompt, max_new_tokens=16)
    ref["sampled"] = tr.generate(prompt, max_new_tokens=16, temperature=1.0, top_k=20, top_p=0.9, seed=7)
    tr.export_adapter(out / "py_peft", format="peft")
    tr.export_adapter(out / "py_adapter.gguf", format="gguf")
    ref["decoded"] = tok.decode(ref["greedy"])
    for _ in range(3):
        tr.step((x,), (y,))
    ref["greedy_8_steps"] = tr.generate(prompt, max_new_tokens=16)
    ref["vocab"] = tok.vocab_size
    tr.close()
    return ref


def _build_and_run(out):
    tokenizer, tok, prog = tiny_llm(out)
    bundle, library = build_jvm_model(prog, out)
    (out / "text.txt").write_text(TEXT, encoding="utf-8")
    core = android.kotlin_core_jar()
    jar = android.compile_kotlin([os.path.join(HERE, "LlmJvmTest.kt")], "llm-jvm-test",
                                 classpath=[core, android.kotlin_stdlib(), android.kotlin_coroutines()])
    work = out / "work"
    work.mkdir()
    facts = run_kotlin_main([core, jar], "LlmJvmTestKt", [bundle, library, tokenizer, work, out / "text.txt", PROMPT],
                            "LlmJvmTest")
    return {"facts": facts, "ref": _python_side(prog, bundle, tok, out)}


@pytest.fixture(scope="module")
def llm_run(tmp_path_factory):
    out, result = run_once(tmp_path_factory, "android-llm-jvm", _build_and_run)
    return out, result["facts"], result["ref"]


def ints(s: str) -> list[int]:
    return [int(v) for v in s.split()]


def test_tokenizer_step_generate_equal_python(llm_run):
    _, facts, ref = llm_run
    assert ints(facts["ids"]) == ref["ids"] and ints(facts["prompt"]) == ref["prompt"]
    assert facts["can_generate"] == "true"
    assert ints(facts["greedy_before"]) == ref["greedy_before"]
    # the same steps, bit for bit (the skipped batch between steps 3 and 4 changed nothing, AdamW's count included)
    assert [np.float32(v) for v in facts["losses"].split()] == [np.float32(v) for v in ref["losses"]]
    assert ref["losses"][-1] < ref["losses"][0] and facts["step_count"] == "5"
    assert ints(facts["greedy"]) == ref["greedy"] and len(ref["greedy"]) == 16
    assert ref["greedy"] != ref["greedy_before"]  # the adapters did train
    assert ints(facts["sampled"]) == ref["sampled"] and facts["sampled_again_equal"] == "true"
    assert facts["decoded"] == ref["decoded"] and facts["none"] == "0"


def test_streaming_callback_and_stop_ids(llm_run):
    _, facts, ref = llm_run
    got, seen = facts["streamed"].split(" | ")
    assert ints(got) == ints(seen) == ref["greedy"][:5]  # true from the listener stops after that token
    stop = int(facts["stop_id"])
    assert ints(facts["stopped"]) == ref["greedy"][:ref["greedy"].index(stop) + 1]  # the stop id is kept


def test_an_all_ignored_batch_is_skipped_and_counted(llm_run):
    _, facts, _ = llm_run
    assert float(facts["skip_loss"]) == 0.0 and facts["skip_status"] == "SKIPPED" and facts["skipped_steps"] == "1"
    assert "no real target" in facts["skip_message"] and facts["skip_state_kept"] == "true"
    assert facts["strict_skip"] == "SKIPPED 1"  # not thrown even when strict (as Python)
    assert facts["after_skip_status"] == "OK"


def test_export_adapter_equals_pythons(llm_run):
    from safetensors.numpy import load_file
    out, facts, _ = llm_run
    kt, py = out / "work" / "peft", out / "py_peft"
    got, want = load_file(kt / "adapter_model.safetensors"), load_file(py / "adapter_model.safetensors")
    assert sorted(got) == sorted(want) and len(got) == 2 * len(LORA_TARGETS) * 2  # two layers, A and B
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    assert (kt / "adapter_model.safetensors").read_bytes() == (py / "adapter_model.safetensors").read_bytes()
    kt_config, py_config = json.loads((kt / "adapter_config.json").read_text()), json.loads((py / "adapter_config.json").read_text())
    kt_config["target_modules"].sort()
    assert kt_config == {k: v for k, v in py_config.items() if k != "revision"}
    assert kt_config["r"] == 4 and kt_config["lora_alpha"] == 8
    # llama.cpp's LoRA adapter: the bytes gguf-py writes for Python's export
    assert facts["gguf"] == "written"
    assert (out / "work" / "adapter.gguf").read_bytes() == (out / "py_adapter.gguf").read_bytes()


def test_generation_while_another_thread_trains_is_serialized(llm_run):
    _, facts, ref = llm_run
    assert facts["concurrent"] == "8 8 8 8 8 8"  # every step applied, every generation whole
    assert ints(facts["greedy_8_steps"]) == ref["greedy_8_steps"]  # the state 8 sequential steps give


def test_misuse_is_a_named_pock_exception(llm_run):
    _, facts, ref = llm_run
    e = {k[len("error."):]: v for k, v in facts.items() if k.startswith("error.")}
    assert e["empty_prompt"].startswith("VALUE ") and "prompt is empty" in e["empty_prompt"]
    assert e["out_of_vocab"].startswith("VALUE ") and f"id {ref['vocab']} at position 1" in e["out_of_vocab"]
    assert e["negative_new"].startswith("VALUE ") and "max_new_tokens must be >= 0" in e["negative_new"]
    assert e["past_context"].startswith("VALUE ") and "past the KV cache" in e["past_context"]
    # past the KV cache too, unless the machine refuses even the lazily mapped room for 2^31 ids first
    assert e["huge_new"].startswith(("VALUE ", "NO_MEMORY ")) and "max_new_tokens 2147483647" in e["huge_new"]
    assert e["top_p"].startswith("VALUE ") and "top_p" in e["top_p"]
    assert e["temperature"].startswith("VALUE ") and "temperature" in e["temperature"]
    assert e["top_k"].startswith("VALUE ") and "top_k" in e["top_k"]
    assert e["format"].startswith("INVALID_ARGUMENT ") and "format must be" in e["format"]
    assert e["unwritable"].startswith("IO ") and "blocker" in e["unwritable"]
    for k in ("reentrant_step", "reentrant_close"):
        assert e[k].startswith("INVALID_ARGUMENT ") and "onToken callback" in e[k]
    assert facts["listener_throws"].startswith("boom at ")  # the listener's own exception comes out
    assert facts["usable_after_errors"] == "true"
    assert e["closed"].startswith("CLOSED ")
    assert facts["done"] == "true"
    assert "FATAL" not in facts["_stderr"] and "WARNING in native method" not in facts["_stderr"]
