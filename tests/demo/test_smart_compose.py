"""demo-apps/keyboard/sim/smart_compose.py: next-word suggestions through the C API the apps call
(the runtime's tokenizer -> the compiled forward -> generate with a streaming stop), on a tiny
Llama with a byte-level BPE trained here; the real SmolLM2 run is slow."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import pockengine as pe

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "demo-apps"))
from keyboard.sim import smart_compose as sc  # noqa: E402

TEXT = ["the licensee may copy the program and distribute it under the terms of this license",
        "you may charge a fee for the physical act of transferring a copy of the program",
        "the program is distributed in the hope that it will be useful but without any warranty"] * 4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(TEXT, trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    bpe.save(str(path))
    tok = pe.Tokenizer.from_pretrained(str(path))
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=64, use_cache=False))
    seq = 32
    ids = torch.tensor([tok.encode(" ".join(TEXT))[:seq + 1]])
    from pockengine.demo_llm import Logits
    prog = pe.compile(Logits(model), (ids[:, :-1],), (ids[:, 1:],), update="none", optimizer=pe.AdamW(lr=1e-2),
                      lora=pe.LoRA(rank=4, alpha=8, targets=sc.LORA_TARGETS))
    return tok, prog.build(), seq, ids


def test_suggestions_are_whole_words_from_the_top_first_tokens(tiny):
    tok, trainer, seq, _ = tiny
    s = sc.Suggester(trainer, tok, seq)
    test = sc.positions(tok, TEXT[:2], seq, limit=6)
    assert test and all(word and " " not in word for _, _, word in test)
    ids, i, word = test[0]
    row = s.logits(list(ids))[i - 1]
    words = s.suggest(list(ids[:i]), row)
    assert len(words) == 3 and all(isinstance(w, str) and " " not in w for w in words)
    first = int(np.argmax(np.where([s.starts_word(t) for t in range(len(row))], row, -np.inf)))
    assert words[0].startswith(sc._word(tok.decode([first])))  # the top token, completed to a word


def test_training_on_the_users_text_improves_its_suggestions(tiny):
    tok, trainer, seq, ids = tiny
    s = sc.Suggester(trainer, tok, seq)
    test = sc.positions(tok, TEXT[:3], seq, limit=12)
    chunks = [ids[0].tolist()]
    before = sc.evaluate(s, test, chunks, prompts=["the program"])
    for _ in range(30):
        trainer.step((ids[:, :-1],), (ids[:, 1:],))
    after = sc.evaluate(s, test, chunks, prompts=["the program"])
    assert after.perplexity < before.perplexity
    assert after.top3 >= before.top3 and after.top1 > 0
    assert isinstance(after.completions["the program"], str)


@pytest.mark.slow
def test_smart_compose_on_smollm2(tmp_path):
    result = sc.run(steps=4, seq=64, held_positions=6, out=tmp_path / "sc.png")
    assert result["after"].perplexity < result["before"].perplexity
    assert (tmp_path / "sc.png").stat().st_size > 10_000
    assert "SmolLM2-135M, base -> LoRA r=8" in sc.table(result)
