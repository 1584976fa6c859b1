"""tok.chat_batch: the model's chat template (SmolLM2's ChatML; Llama-2's [INST]) with
assistant-only, next-token-shifted labels, against transformers' apply_chat_template ids."""
import numpy as np
import pytest
from tok_corpora import smollm2_gguf

import pockengine as pe
from pockengine.runtime.chat import LLAMA2_TEMPLATE

CONVS = [
    [{"role": "user", "content": "Hi there!"}, {"role": "assistant", "content": "Hello! How can I help?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3?"},
     {"role": "assistant", "content": "6, of course."}],
    [{"role": "user", "content": "Écris un haïku 🌸"}, {"role": "assistant", "content": " Fleurs de cerisier\n"}],
]


def check(tok, hf, convs, seq_len, end_text):
    x, y = tok.chat_batch(convs, seq_len)
    assert x.dtype == y.dtype == np.int64 and x.shape == y.shape == (len(convs), seq_len)
    for b, conv in enumerate(convs):
        ref = list(hf.apply_chat_template(conv, tokenize=True, return_dict=True)["input_ids"])
        n = min(len(ref) - 1, seq_len)
        assert x[b, :n].tolist() == ref[:n]  # inputs: the template's tokens, padded
        assert (x[b, n:] == tok.pad_id).all() and (y[b, n:] == -100).all()
        keep = y[b] != -100
        assert (y[b, keep] == np.asarray(ref[1:n + 1])[keep[:n]]).all()  # targets: the next token
        # what is learned: exactly each assistant message's content and its end token
        want = "".join(m["content"].strip() if "[INST]" in tok.decode(ref) else m["content"]
                       for m in conv if m["role"] == "assistant")
        got = tok.decode(y[b, keep].tolist()).replace(end_text, "")
        assert got.replace(" ", "") == want.replace(" ", "")
        assert tok.decode(y[b, keep].tolist()).count(end_text) == sum(m["role"] == "assistant" for m in conv)


def test_smollm2_chatml_matches_apply_chat_template(smollm2_dir):
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(smollm2_dir)
    for tok in (pe.Tokenizer.from_pretrained(smollm2_gguf()), pe.Tokenizer.from_pretrained(smollm2_dir)):
        assert "<|im_start|>" in tok.chat_template
        check(tok, hf, CONVS, 96, "<|im_end|>")


def test_truncation_keeps_the_start(smollm2_dir):
    tok = pe.Tokenizer.from_pretrained(smollm2_gguf())
    x, y = tok.chat_batch(CONVS[1:2], 8)
    fx, fy = tok.chat_batch(CONVS[1:2], 200)
    assert (x == fx[:, :8]).all() and (y == fy[:, :8]).all()


def test_llama2_inst_template(trained):
    from transformers import PreTrainedTokenizerFast
    path = trained["llama2-style"]
    tok = pe.Tokenizer.from_pretrained(path)
    assert tok.chat_template is None and tok.bos_id == 1 and tok.eos_id == 2  # falls back to [INST]
    hf = PreTrainedTokenizerFast(tokenizer_file=str(path), bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    hf.chat_template = LLAMA2_TEMPLATE
    tok.pad_id = 0
    check(tok, hf, [CONVS[0], CONVS[1]], 128, "</s>")


def test_bad_conversations():
    tok = pe.Tokenizer.from_pretrained(smollm2_gguf())
    with pytest.raises(pe.PockError, match="seq_len"):
        tok.chat_batch(CONVS, 0)
    with pytest.raises(pe.PockError, match="message 0 is not a dict"):
        tok.chat_batch([[("user", "hi")]], 8)
    with pytest.raises(pe.PockError, match="non-empty list"):
        tok.chat_batch([], 8)
