"""The personalization simulation (demo-apps/keyboard/sim) on a tiny setting: a small
random-weight KeyboardLM over the user's own words, two rounds of text, both schemes
through PockEngine's compiled step; and the shipped base model's files."""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "demo-apps"))
from keyboard.model import corpora, lm  # noqa: E402
from keyboard.model.tokenizer import SPECIALS, Tokenizer, tokens  # noqa: E402
from keyboard.model.lm import KeyboardLM  # noqa: E402
from keyboard.sim import simulate as sim  # noqa: E402


def test_tiny_simulation(tmp_path):
    sentences = corpora.user_sentences()[:120]
    counts = Counter(t for s in sentences for t in tokens(s))
    tok = Tokenizer(list(SPECIALS) + [w for w, _ in counts.most_common(300) if w not in SPECIALS])

    def tiny_model():
        import torch
        torch.manual_seed(0)
        return KeyboardLM(len(tok), emb=16, hidden=32)

    lines = []
    result = sim.simulate(rounds=2, batch=4, seq=8, policy=sim.Policy(min_new_tokens=50, max_steps=40), lr=1e-2,
                          schemes={"full": "full", "sparse": lm.SPARSE_UPDATE}, model_fn=tiny_model, tok=tok,
                          sentences=sentences, log=lines.append)
    full, sparse = result["runs"]
    assert [len(r.curve) for r in result["runs"]] == [3, 3]
    assert full.steps == sparse.steps == 80 and len(full.losses) == 80
    assert full.stats["trainable_elements"] == full.stats["total_parameter_elements"]
    assert sparse.stats["trainable_elements"] < full.stats["trainable_elements"]
    assert sparse.stats["arena_bytes"] + sparse.stats["state_bytes"] < full.stats["arena_bytes"] + full.stats["state_bytes"]
    # a random model knows nothing; training on the user's text must lift held-out top-3
    assert full.curve[-1][2] > result["base"][1] + 0.05, full.curve
    assert np.mean(full.losses[-10:]) < np.mean(full.losses[:10])
    assert any("round 2/2" in line for line in lines)
    table = sim.table(result)
    assert table.count("\n") == 4 and "full update" in table and "sparse update" in table
    png = sim.plot(result, tmp_path / "curve.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_evaluate_counts_only_suggestable_targets():
    """evaluate() ranks only words the strip can show and skips other targets."""
    tok = Tokenizer(list(SPECIALS) + [".", "a", "b", "c", "d"])

    class Fixed:   # a trainer whose forward always ranks d > c > b > a
        def forward(self, inputs):
            x = inputs[0].numpy()
            out = np.zeros(x.shape + (len(tok),), dtype=np.float32)
            out[..., 5:] = [1, 2, 3, 4]
            out[..., 4] = 9   # "." scores highest but is never suggested
            return out

    ids = np.array([2, 8, 7, 4, 6, 5, 1], dtype=np.int64)   # <s> d c . b a <unk>
    top1, top3 = sim.evaluate(Fixed(), tok, ids, batch=1, seq=4)
    # targets: d(ok top1) c(top3) .(skipped) b(top3) a(miss) <unk>(skipped)
    assert (top1, top3) == (1 / 4, 3 / 4)


def test_shipped_base_model():
    words = (lm.HERE / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert len(words) == lm.VOCAB and tuple(words[:4]) == SPECIALS and len(set(words)) == lm.VOCAB
    model = lm.load_base()
    n = sum(p.numel() for p in model.parameters())
    assert 1e6 < n < 3e6 and lm.WEIGHTS.stat().st_size < 8 * 2**20
    assert "fortunes" in lm.base_meta()["corpus"]


def test_base_spec_compiles_with_the_sparse_scheme():
    """spec.py:make_base (what pock-build compiles for the apps) at the shipped shape."""
    import importlib.util

    import pockengine as pe
    loader = importlib.util.spec_from_file_location("keyboard_spec_base", lm.HERE / "spec.py")
    spec = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(spec)
    kwargs = spec.make_base()
    assert kwargs["example_inputs"][0].shape == (lm.BATCH, lm.SEQ) and kwargs["update"] == lm.SPARSE_UPDATE
    stats = pe.compile(**kwargs).stats()
    assert stats["total_parameter_elements"] == sum(p.numel() for p in kwargs["model"].parameters())
    assert stats["trainable_elements"] < stats["total_parameter_elements"] / 2
    assert len(spec.make_base_search()["sample_batches"]) == 8
