"""The NFC normalizer (native/runtime/tokenizer/nfc.cpp, Qwen2's tokenizer.json
`"normalizer": {"type": "NFC"}`): a Qwen2-pattern byte-level BPE with that normalizer gives
Hugging Face `tokenizers`' ids on decomposed (NFD) text, on text whose marks are out of
canonical order, on Hangul jamo, and on the multilingual stress set as it is, in NFD and NFKD."""
import json
import unicodedata

import pytest
from tok_corpora import corpora

import pockengine as pe

HARD = ["e\u0301cole, Cafe\u0301, man\u0303ana, A\u030a",             # decomposed Latin
        "a\u0328\u0301 a\u0301\u0328 q\u0307\u0323 \u1e0b\u0323",        # marks out of canonical order
        "\u1100\u1161\u11a8 \u1112\u1161\u11ab\u1100\u1173\u11af",       # Hangul jamo -> syllables
        "\u0958 \u2126 \u212b \u0344 \u0f73",                            # exclusions and singletons
        "Vie\u0323\u0302t Nam, \u03b1\u0313\u0301\u0345, \u0627\u0653", # stacked marks, Greek, Arabic
        "\u0301 starts with a mark; \u3099\u304b\u3099",                # a leading mark, kana voicing
        "plain ASCII stays as it is"]


@pytest.fixture(scope="module")
def qwen2_nfc(trained, tmp_path_factory):
    j = json.loads(trained["qwen2-split"].read_text())
    j["normalizer"] = {"type": "NFC"}
    path = tmp_path_factory.mktemp("nfc") / "qwen2_nfc.json"
    path.write_text(json.dumps(j, ensure_ascii=False))
    return path


def test_nfc_matches_hugging_face(qwen2_nfc):
    from tokenizers import Tokenizer as HF
    hf = HF.from_file(str(qwen2_nfc))
    tok = pe.Tokenizer.from_pretrained(qwen2_nfc)
    texts = HARD + [t for _, t in corpora()["stress"]]
    n = 0
    for text in texts:
        for s in (text, unicodedata.normalize("NFD", text), unicodedata.normalize("NFKD", text)):
            want = hf.encode(s).ids
            assert tok.encode(s) == want, ascii(s)
            n += 1
    for text in HARD[:6]:  # the normalizer really composes: these decode to their NFC form
        assert tok.decode(tok.encode(text)) == unicodedata.normalize("NFC", text) != text
    print(f"NFC: {n} texts, ids identical to Hugging Face's")
