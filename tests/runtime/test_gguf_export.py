"""trainer.export_gguf (pockengine/runtime/gguf_export.py): the merged model as a GGUF file in
llama.cpp's layout, read back with gguf.GGUFReader (names, shapes, metadata, the merged
weights with q/k rows in llama.cpp's rotary order); with llama-cpp-python installed, the
slow test runs the merged SmolLM2 in llama.cpp and gets the trainer's greedy tokens."""
import numpy as np
import pytest
import torch

import pockengine as pe
from test_generate import batch, compile_llama, tiny_llama


@pytest.fixture(scope="module")
def trained():
    trainer = compile_llama(tiny_llama()).build()
    for i in range(4):
        x, y = batch(1 + i % 2)
        trainer.step((x,), (y,))
    yield trainer
    trainer.close()


def fields_of(r):
    out = {}
    for k, f in r.fields.items():
        out[k] = f.contents()
    return out


def test_merged_model_layout(trained, tmp_path):
    import gguf
    path = tmp_path / "model.gguf"
    trained.export_gguf(path)
    r = gguf.GGUFReader(str(path))
    f = fields_of(r)
    assert f["general.architecture"] == "llama" and f["general.type"] == "model"
    assert (f["llama.block_count"], f["llama.embedding_length"], f["llama.feed_forward_length"]) == (2, 64, 128)
    assert (f["llama.attention.head_count"], f["llama.attention.head_count_kv"]) == (4, 2)
    assert f["llama.rope.dimension_count"] == 16 and f["llama.vocab_size"] == 256
    assert abs(f["llama.rope.freq_base"] - 10000.0) < 1e-3 and f["tokenizer.ggml.model"] == "no_vocab"
    t = {x.name: np.asarray(x.data) for x in r.tensors}
    assert len(t) == 3 + 2 * 9  # embedding, final norm, output (untied); 9 per layer
    merged = {k: v.numpy() for k, v in trained.merged_state_dict().items()}
    np.testing.assert_array_equal(t["token_embd.weight"].reshape(256, 64), merged["model.embed_tokens.weight"])
    np.testing.assert_array_equal(t["output.weight"].reshape(256, 64), merged["lm_head.weight"])
    q = merged["model.layers.1.self_attn.q_proj.weight"]  # LoRA merged in, rows in llama.cpp's rotary order
    assert np.abs(q - tiny_llama().state_dict()["model.layers.1.self_attn.q_proj.weight"].numpy()).max() > 1e-4
    np.testing.assert_array_equal(t["blk.1.attn_q.weight"].reshape(64, 64),
                                  q.reshape(4, 2, 8, 64).swapaxes(1, 2).reshape(64, 64))
    k = merged["model.layers.0.self_attn.k_proj.weight"]
    np.testing.assert_array_equal(t["blk.0.attn_k.weight"].reshape(32, 64),
                                  k.reshape(2, 2, 8, 64).swapaxes(1, 2).reshape(32, 64))
    np.testing.assert_array_equal(t["blk.1.ffn_down.weight"].reshape(64, 128),
                                  merged["model.layers.1.mlp.down_proj.weight"])
    np.testing.assert_array_equal(t["blk.0.ffn_norm.weight"], merged["model.layers.0.post_attention_layernorm.weight"])


def test_export_gguf_errors_are_named(trained, tmp_path):
    (tmp_path / "bad.gguf").write_bytes(b"not a gguf file")
    with pytest.raises(pe.PockError, match="not a readable GGUF"):
        trained.export_gguf(tmp_path / "m.gguf", tokenizer=tmp_path / "bad.gguf")
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(pe.PockError, match="cannot write"):
        trained.export_gguf(blocker / "m.gguf")
    plain = pe.compile(torch.nn.Sequential(torch.nn.Linear(4, 3)), (torch.randn(2, 4),), (torch.tensor([0, 1]),),
                       name="no_decoder").build()
    with pytest.raises(pe.PockError, match="Llama-family decoder"):
        plain.export_gguf(tmp_path / "y.gguf")
    plain.close()


@pytest.mark.slow
def test_llama_cpp_runs_the_merged_smollm2(tmp_path):
    """SmolLM2 + 8 LoRA steps, merged and exported (the tokenizer copied from the base GGUF):
    llama.cpp's greedy tokens equal trainer.generate's on three prompts."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from pockengine.demo_llm import Logits, load_smollm2, smollm2_dir
    tok, model = load_smollm2()
    ids = tok("You may convey verbatim copies of the Program's source code as you receive it, in any medium, "
              "provided that you conspicuously and appropriately publish on each copy an appropriate copyright "
              "notice.")["input_ids"]  # test_adapters.py's text and step: the same build
    x, y = torch.tensor([ids[:-1]]), torch.tensor([ids[1:]])
    trainer = pe.compile(Logits(model), (x,), (y,), update="none", optimizer=pe.AdamW(lr=5e-3),
                         lora=pe.LoRA(rank=8, alpha=16, targets=["*.q_proj", "*.k_proj", "*.v_proj", "*.o_proj"])).build()
    for _ in range(8):
        trainer.step((x,), (y,))
    trainer.export_gguf(tmp_path / "merged.gguf", tokenizer=smollm2_dir())
    llm = llama_cpp.Llama(model_path=str(tmp_path / "merged.gguf"), n_ctx=128, n_threads=2, logits_all=True,
                          verbose=False)  # (0.3.36 keeps no scores without logits_all)
    same = 0
    prompts = ["You may convey", "Once upon a time", "def fibonacci(n):"]
    for text in prompts:
        p = tok(text)["input_ids"]
        ours = trainer.generate(p, max_new_tokens=24)
        llm.reset()
        llm.eval(p)
        theirs = []
        for _ in range(24):
            t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            theirs.append(t)
            llm.eval([t])
        print(f"{text!r}: ours {ours[:8]}..., llama.cpp {theirs[:8]}...")
        same += ours == theirs
    trainer.close()
    assert same == len(prompts)
