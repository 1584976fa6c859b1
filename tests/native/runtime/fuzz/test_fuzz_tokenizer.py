"""Coverage-guided fuzzing of the runtime's tokenizer (issue 37), as test_fuzz_checkpoint.py
does for the checkpoint parser: libFuzzer (clang 14) with AddressSanitizer and UBSan over
fuzz_tokenizer.cpp (hostile tokenizer.json / GGUF bytes, encode of arbitrary bytes with a
byte-level and a SentencePiece-style BPE, decode of arbitrary ids), seeded with small
tokenizer.json and GGUF files written here, for a bounded time (POCK_FUZZ_TOKENIZER_SECONDS,
default 25 s)."""
import json
import os
import struct
from pathlib import Path

from fuzzing import RUNTIME, build_fuzzer, run_fuzzer

HERE = Path(__file__).resolve().parent
SECONDS = int(os.environ.get("POCK_FUZZ_TOKENIZER_SECONDS", "25"))


def gguf_bytes(model: str, tokens: list[str], merges=(), scores=None, types=None) -> bytes:
    """A GGUF v3 file holding only tokenizer metadata (no tensors)."""
    def s(x: str) -> bytes:
        b = x.encode()
        return struct.pack("<Q", len(b)) + b
    kv = [(s("general.architecture"), 8, s("llama")), (s("tokenizer.ggml.model"), 8, s(model)),
          (s("tokenizer.ggml.tokens"), 9, struct.pack("<IQ", 8, len(tokens)) + b"".join(map(s, tokens))),
          (s("tokenizer.ggml.bos_token_id"), 4, struct.pack("<I", 1)),
          (s("tokenizer.ggml.eos_token_id"), 4, struct.pack("<I", 2)),
          (s("tokenizer.ggml.add_bos_token"), 7, b"\x01")]
    if merges:
        kv.append((s("tokenizer.ggml.merges"), 9, struct.pack("<IQ", 8, len(merges)) + b"".join(map(s, merges))))
    if scores is not None:
        kv.append((s("tokenizer.ggml.scores"), 9, struct.pack(f"<IQ{len(scores)}f", 6, len(scores), *scores)))
    if types is not None:
        kv.append((s("tokenizer.ggml.token_type"), 9, struct.pack(f"<IQ{len(types)}i", 5, len(types), *types)))
    body = b"".join(k + struct.pack("<I", t) + v for k, t, v in kv)
    return b"GGUF" + struct.pack("<IQQ", 3, 0, len(kv)) + body


def seeds(corpus: Path) -> None:
    byte_alphabet = [chr(c) for c in range(33, 127)] + ["Ġ", "Ċ", "ĉ"]
    tj = {"added_tokens": [{"id": 0, "content": "<|im_end|>", "special": True}],
          "normalizer": None,
          "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True},
                                                                  {"type": "ByteLevel", "add_prefix_space": False}]},
          "decoder": {"type": "ByteLevel"},
          "model": {"type": "BPE", "vocab": {"<|im_end|>": 0, **{c: i + 1 for i, c in enumerate(byte_alphabet)},
                                             "Ġt": 100, "he": 101}, "merges": [["Ġ", "t"], ["h", "e"]]}}
    sp = {"added_tokens": [{"id": 1, "content": "<s>", "special": True}],
          "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": True},
          "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Metaspace", "replacement": "▁",
                                                                                  "prepend_scheme": "first"}]},
          "model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": True, "fuse_unk": True,
                    "vocab": {"<unk>": 0, "<s>": 1, "<0x41>": 2, "<0xC3>": 3, "▁": 4, "a": 5, "▁a": 6},
                    "merges": ["▁ a"]}}
    files = {
        "json_bytelevel": b"\x00" + json.dumps(tj).encode(),
        "json_sentencepiece": b"\x00" + json.dumps(sp, ensure_ascii=False).encode(),
        "json_nfc": b"\x00" + json.dumps({**tj, "normalizer": {"type": "NFC"}}).encode(),
        "gguf_gpt2": b"\x00" + gguf_bytes("gpt2", ["<|endoftext|>", "<s>", "</s>", "a", "b", "ab", "Ġ"], ["a b"],
                                          types=[3, 3, 3, 1, 1, 1, 1]),
        "gguf_llama": b"\x00" + gguf_bytes("llama", ["<unk>", "<s>", "</s>", "▁", "a", "▁a", "<0x41>"],
                                           scores=[0, 0, 0, -1, -2, -0.5, 0], types=[2, 3, 3, 1, 1, 1, 6]),
        # empty score / token-type arrays: memcpy from a null data() was undefined (found by this fuzzer)
        "gguf_empty_arrays": b"\x00" + gguf_bytes("llama", ["<unk>", "<s>", "</s>"], scores=[], types=[]),
        "text_bytelevel": b"\x01Hello the world, it's 123 \xf0\x9f\xa4\x96 \xff\xfe <|im_end|>\n\n  x",
        "text_sentencepiece": b"\x02ab a b \xc3\xa9\xc3 <s></s> ",
        "ids": b"\x03" + struct.pack("<8i", 0, 1, 5, 262, 263, 600, -1, 2**31 - 1),
    }
    for name, data in files.items():
        (corpus / name).write_bytes(data)


def test_fuzz_tokenizer(tmp_path):
    exe = build_fuzzer(tmp_path, "fuzz_tokenizer", [HERE / "fuzz_tokenizer.cpp",
                                                    *sorted((RUNTIME / "tokenizer").glob("*.cpp")),
                                                    RUNTIME / "tokenizer" / "standalone" / "last_error.cpp"])
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    seeds(corpus)
    runs, n_seeds, grown = run_fuzzer(exe, corpus, SECONDS, malloc_limit_mb=256, max_len=8192, detect_leaks=True)
    print(f"fuzzed the tokenizer {SECONDS} s: {runs} runs, corpus {n_seeds} seeds -> {grown} inputs")
    assert runs > 1000 and grown > n_seeds


def test_seeds_open(tmp_path):
    """The seed files are real tokenizers (so the fuzzer starts from inputs that open)."""
    import pockengine as pe
    seeds(tmp_path)
    for name in ("json_bytelevel", "json_sentencepiece", "gguf_gpt2", "gguf_llama"):
        tok = pe.Tokenizer.from_bytes((tmp_path / name).read_bytes()[1:])
        ids = tok.encode("a ab the")
        assert ids and tok.decode(ids).strip(), name
