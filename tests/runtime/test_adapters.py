"""Adapters out (trainer.export_adapter, pockengine/runtime/adapters.py): a trained LoRA adapter as
PEFT (peft.PeftModel.from_pretrained on the transformers base model gives the trainer's
logits) and as a llama.cpp GGUF LoRA adapter (read back with gguf.GGUFReader; with
llama-cpp-python installed, the slow test runs it on the real SmolLM2 GGUF); the C API's
pock_export_adapter (what the SDKs call) writes both byte for byte / tensor for tensor alike."""
import json

import numpy as np
import pytest
import torch

import pockengine as pe
from test_generate import SEQ, batch, compile_llama, tiny_llama


@pytest.fixture(scope="module")
def trained():
    trainer = compile_llama(tiny_llama()).build()
    for i in range(4):
        x, y = batch(1 + i % 2)
        trainer.step((x,), (y,))
    yield trainer
    trainer.close()


def test_peft_round_trip_gives_the_trainers_logits(trained, tmp_path):
    peft = pytest.importorskip("peft")
    trained.export_adapter(tmp_path / "adapter", format="peft")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8 and config["peft_type"] == "LORA"
    model = peft.PeftModel.from_pretrained(tiny_llama().eval(), tmp_path / "adapter")
    x, _ = batch(9)
    with torch.no_grad():
        want = model(input_ids=x).logits.numpy()
    got = trained.forward((x,))
    print(f"PEFT round trip: max |logits - trainer's| = {np.abs(got - want).max():.3g}")
    assert np.abs(got - want).max() < 1e-4
    assert np.abs(want - tiny_llama().eval()(input_ids=x).logits.detach().numpy()).max() > 1e-2  # it did train


def test_c_api_writes_the_same_peft_adapter(trained, tmp_path):
    """pock_export_adapter (native/runtime/export.cpp), the call the SDKs make."""
    import ctypes

    from safetensors.numpy import load_file
    lib = trained._lib
    lib.pock_export_adapter.restype = ctypes.c_int32
    lib.pock_export_adapter.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
    assert lib.pock_export_adapter(trained._handle, str(tmp_path / "c").encode(), b"peft") == 0
    trained.export_adapter(tmp_path / "py", format="peft")
    got, want = load_file(tmp_path / "c" / "adapter_model.safetensors"), load_file(tmp_path / "py" / "adapter_model.safetensors")
    assert sorted(got) == sorted(want) and len(got) == 12
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    c_config = json.loads((tmp_path / "c" / "adapter_config.json").read_text())
    py_config = json.loads((tmp_path / "py" / "adapter_config.json").read_text())
    c_config["target_modules"].sort()
    assert c_config == {k: v for k, v in py_config.items() if k != "revision"}
    assert lib.pock_export_adapter(trained._handle, str(tmp_path / "d").encode(), b"onnx") == 1
    assert "format must be" in lib.pock_last_error().decode()
    (tmp_path / "file").write_text("")
    assert lib.pock_export_adapter(trained._handle, str(tmp_path / "file" / "x").encode(), b"peft") == 5  # IO


def test_c_api_writes_the_same_gguf_adapter(trained, tmp_path):
    """pock_export_adapter(t, path, "gguf") (export.cpp) writes the bytes gguf-py's GGUFWriter
    writes for adapters.py: kv pairs, tensor infos, q's permuted rows, 32-byte alignment."""
    import ctypes
    lib = trained._lib
    lib.pock_export_adapter.restype = ctypes.c_int32
    lib.pock_export_adapter.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
    assert lib.pock_export_adapter(trained._handle, str(tmp_path / "c.gguf").encode(), b"gguf") == 0
    trained.export_adapter(tmp_path / "py.gguf", format="gguf")
    got, want = (tmp_path / "c.gguf").read_bytes(), (tmp_path / "py.gguf").read_bytes()
    assert len(got) == len(want) and got == want
    assert lib.pock_export_adapter(trained._handle, str(tmp_path / "nowhere" / "x.gguf").encode(), b"gguf") == 5  # IO


def test_gguf_adapter_layout(trained, tmp_path):
    import gguf
    path = tmp_path / "adapter.gguf"
    trained.export_adapter(path, format="gguf")
    r = gguf.GGUFReader(str(path))
    fields = {k: f for k, f in r.fields.items()}

    def text(key):
        f = fields[key]
        return bytes(f.parts[f.data[0]]).decode()
    assert text("general.type") == "adapter" and text("adapter.type") == "lora"
    assert text("general.architecture") == "llama"
    assert float(fields["adapter.lora.alpha"].parts[-1][0]) == 8.0
    tensors = {t.name: t for t in r.tensors}
    assert len(tensors) == 2 * 3 * 2  # two layers, q/v/down, a and b
    a = tensors["blk.1.ffn_down.weight.lora_a"]
    b = tensors["blk.1.ffn_down.weight.lora_b"]
    assert list(a.shape) == [128, 4] and list(b.shape) == [4, 64]  # ggml ne: [in, r], [r, out]
    np.testing.assert_array_equal(np.asarray(a.data).reshape(4, 128),
                                  trained.get_tensor("model.layers.1.mlp.down_proj.lora_A"))
    np.testing.assert_array_equal(np.asarray(b.data).reshape(64, 4),
                                  trained.get_tensor("model.layers.1.mlp.down_proj.lora_B"))
    # q's rows in llama.cpp's rotary order (convert_hf_to_gguf's permute), v's as they are
    qb = trained.get_tensor("model.layers.0.self_attn.q_proj.lora_B")
    got = np.asarray(tensors["blk.0.attn_q.weight.lora_b"].data).reshape(64, 4)
    np.testing.assert_array_equal(got, qb.reshape(4, 2, 8, 4).swapaxes(1, 2).reshape(64, 4))
    np.testing.assert_array_equal(np.asarray(tensors["blk.0.attn_v.weight.lora_b"].data).reshape(32, 4),
                                  trained.get_tensor("model.layers.0.self_attn.v_proj.lora_B"))


def test_export_errors_are_named(trained, tmp_path):
    with pytest.raises(pe.PockError, match="format must be 'peft' or 'gguf'"):
        trained.export_adapter(tmp_path / "x", format="onnx")
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(pe.PockError, match="cannot"):
        trained.export_adapter(blocker / "adapter", format="peft")
    plain = pe.compile(torch.nn.Sequential(torch.nn.Linear(4, 3)), (torch.randn(2, 4),), (torch.tensor([0, 1]),),
                       name="no_adapters").build()
    with pytest.raises(pe.PockError, match="no LoRA adapters"):
        plain.export_adapter(tmp_path / "y")
    import ctypes  # the C API (what the SDKs call) names it too, for either format
    lib = plain._lib
    lib.pock_export_adapter.restype = ctypes.c_int32
    lib.pock_export_adapter.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
    for fmt in (b"peft", b"gguf"):
        assert lib.pock_export_adapter(plain._handle, str(tmp_path / "z").encode(), fmt) == 1
        assert "Llama-family decoder" in lib.pock_last_error().decode()
    assert not (tmp_path / "z").exists()
    plain.close()


@pytest.mark.slow
def test_llama_cpp_runs_our_gguf_adapter_on_smollm2(tmp_path):
    """llama.cpp (llama-cpp-python==0.3.36) with the base SmolLM2 as a GGUF file and our adapter:
    its next-token argmax agrees with the trainer's on >= 95% of a held-out text's positions.
    The base is the fp32 model trainer.export_gguf writes before training (llama.cpp then
    computes in fp32, as the trainer does); on the Q4_1 file itself llama.cpp also rounds the
    activations to 8 bits, and that agreement (and the agreement without the adapter) is printed."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from pockengine.demo_llm import Logits, load_smollm2, smollm2_dir
    tok, model = load_smollm2()
    seq = 64
    text = ("You may convey verbatim copies of the Program's source code as you receive it, in any medium, "
            "provided that you conspicuously and appropriately publish on each copy an appropriate copyright notice.")
    ids = tok(text)["input_ids"][:seq + 1]
    seq = len(ids) - 1  # the text is shorter than 64 tokens
    x = torch.tensor([ids[:seq]])
    y = torch.tensor([ids[1:seq + 1]])
    prog = pe.compile(Logits(model), (x,), (y,), update="none", optimizer=pe.AdamW(lr=5e-3),
                      lora=pe.LoRA(rank=8, alpha=16, targets=["*.q_proj", "*.k_proj", "*.v_proj", "*.o_proj"]))
    trainer = prog.build()
    trainer.export_gguf(tmp_path / "base.gguf", tokenizer=smollm2_dir())  # adapters still zero: the base, fp32
    for _ in range(8):
        trainer.step((x,), (y,))
    trainer.export_adapter(tmp_path / "lora.gguf", format="gguf")
    held = tok("This License applies to any program or other work which contains a notice placed by the "
               "copyright holder saying it may be distributed under the terms of this General Public License.")
    held = held["input_ids"][:seq]
    ours = trainer.forward((torch.tensor([held + [0] * (seq - len(held))]),))[0, :len(held)].argmax(-1)

    def agreement(base, lora):
        llm = llama_cpp.Llama(model_path=str(base), lora_path=lora and str(lora), logits_all=True, n_ctx=256,
                              n_threads=2, verbose=False)
        llm.eval(held)
        return float((ours == np.asarray(llm.scores[:len(held)]).argmax(-1)).mean())
    agree = agreement(tmp_path / "base.gguf", tmp_path / "lora.gguf")
    on_q41 = agreement(smollm2_dir(), tmp_path / "lora.gguf")
    without = agreement(tmp_path / "base.gguf", None)
    print(f"llama.cpp vs trainer next-token argmax agreement over {len(held)} positions: {agree:.3f} (fp32 base + "
          f"our adapter), {on_q41:.3f} (the Q4_1 GGUF + our adapter), {without:.3f} (fp32 base, no adapter)")
    assert agree >= 0.95
