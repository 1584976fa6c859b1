"""Benchmark models (random init) and their update schemes for `make bench`.

Every model is built from a fixed seed, so every framework's worker process
starts from bit-identical weights and sees the same batches.

    keyboard LSTM LM         vocab 10k, embedding 96, 2-layer nn.LSTM hidden 670 proj_size 96
                             (CIFG-sized LSTM with projection), output Linear(96, 10k);
                             batch 4 x seq 20 and batch 1 x seq 16
    keyboard transformer LM  vocab 8k, d_model 256, 4 pre-LN layers, 4 heads, FFN 1024 (GELU),
                             causal F.scaled_dot_product_attention, untied head; batch 8 x seq 64
    MobileNetV2              width 1.0, 128x128 input, 10 classes, batch 8 (inverted residual
                             blocks, BatchNorm, ReLU6; no dropout: a benchmark step must be
                             deterministic)

Schemes (ratio < 1 trains only the first ceil(ratio * in_channels) input channels):
    full        every parameter
    last        only the output layer (LSTM: fc, transformer: head, CNN: classifier)
    sparse      transformer: qkv + output projection, fc1 and both LayerNorms of the last 2 blocks,
                             and the final LayerNorm;
                CNN:         first pointwise (expand) conv of the last 4 inverted residual blocks at
                             ratio 0.5, the BatchNorms of those blocks, the classifier;
                LSTM:        the last LSTM layer (weight_ih_l1, weight_hh_l1, weight_hr_l1 at ratio
                             0.5, its biases whole) and the output projection (fc.weight at ratio
                             0.5, fc.bias whole).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F


# ----------------------------------------------------------------------------- models
class KeyboardLSTM(nn.Module):
    def __init__(self, vocab=10_000, emb=96, hidden=670, proj=96, layers=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb)
        self.lstm = nn.LSTM(emb, hidden, num_layers=layers, proj_size=proj, batch_first=True)
        self.fc = nn.Linear(proj, vocab)

    def forward(self, idx):
        h, _ = self.lstm(self.emb(idx))
        return self.fc(h)


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln1(x)); x + fc2(gelu(fc1(ln2(x))))."""

    def __init__(self, d, heads, ffn):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, ffn)
        self.fc2 = nn.Linear(ffn, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class KeyboardTransformer(nn.Module):
    def __init__(self, vocab=8000, d=256, layers=4, heads=4, ffn=1024, seq=64):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        self.blocks = nn.ModuleList(Block(d, heads, ffn) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)
        nn.init.normal_(self.tok.weight, std=0.02)

    def forward(self, idx):
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


class InvertedResidual(nn.Module):
    def __init__(self, inp, out, stride, expand):
        super().__init__()
        hid = inp * expand
        self.has_expand = expand != 1
        if self.has_expand:
            self.expand = nn.Conv2d(inp, hid, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(hid)
        self.dw = nn.Conv2d(hid, hid, 3, stride=stride, padding=1, groups=hid, bias=False)
        self.bn2 = nn.BatchNorm2d(hid)
        self.project = nn.Conv2d(hid, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.residual = stride == 1 and inp == out

    def forward(self, x):
        h = F.relu6(self.bn1(self.expand(x))) if self.has_expand else x
        h = F.relu6(self.bn2(self.dw(h)))
        h = self.bn3(self.project(h))
        return x + h if self.residual else h


def _make_divisible(v, divisor=8):
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


class MobileNetV2(nn.Module):
    # (expansion t, channels c, repeats n, first stride s), as in the paper / torchvision
    CONFIG = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
              (6, 320, 1, 1)]

    def __init__(self, classes=10, width=1.0, config=None, last_channels=1280):
        super().__init__()
        config = config or self.CONFIG
        inp = _make_divisible(32 * width)
        last = _make_divisible(last_channels * max(1.0, width))
        self.stem = nn.Conv2d(3, inp, 3, stride=2, padding=1, bias=False)
        self.stem_bn = nn.BatchNorm2d(inp)
        blocks = []
        for t, c, n, s in config:
            out = _make_divisible(c * width)
            for i in range(n):
                blocks.append(InvertedResidual(inp, out, s if i == 0 else 1, t))
                inp = out
        self.blocks = nn.ModuleList(blocks)
        self.head_conv = nn.Conv2d(inp, last, 1, bias=False)
        self.head_bn = nn.BatchNorm2d(last)
        self.classifier = nn.Linear(last, classes)
        for m in self.modules():  # torchvision's init
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        x = F.relu6(self.stem_bn(self.stem(x)))
        for blk in self.blocks:
            x = blk(x)
        x = F.relu6(self.head_bn(self.head_conv(x)))
        return self.classifier(F.adaptive_avg_pool2d(x, 1).flatten(1))


# ----------------------------------------------------------------------------- schemes
def lstm_sparse(model: KeyboardLSTM) -> dict:
    last = model.lstm.num_layers - 1
    scheme = {f"lstm.bias_*_l{last}": 1.0, "fc.weight": 0.5, "fc.bias": 1.0}
    for name, _ in model.named_parameters():
        if name.startswith(f"lstm.weight_") and name.endswith(f"_l{last}"):
            scheme[name] = 0.5
    return scheme


def transformer_sparse(model: KeyboardTransformer) -> dict:
    n = len(model.blocks)
    scheme = {"ln_f.*": 1.0}
    for i in range(max(0, n - 2), n):
        for p in ("qkv.*", "proj.*", "fc1.*", "ln1.*", "ln2.*"):
            scheme[f"blocks.{i}.{p}"] = 1.0
    return scheme


def cnn_sparse(model: MobileNetV2) -> dict:
    scheme = {"classifier.*": 1.0}
    for i in range(len(model.blocks) - 4, len(model.blocks)):
        blk = model.blocks[i]
        first_pw = "expand" if blk.has_expand else "project"
        scheme[f"blocks.{i}.{first_pw}.weight"] = 0.5
        scheme[f"blocks.{i}.bn*"] = 1.0
    return scheme


@dataclass
class Workload:
    key: str            # e.g. "lstm_b4s20"
    title: str          # human-readable model name + shape
    make: callable      # () -> nn.Module (seeded)
    inputs: callable    # (generator) -> (tuple of inputs, tuple of targets)
    schemes: dict = field(default_factory=dict)  # scheme name -> (model) -> update


def _tokens(vocab, b, t):
    def f(g):
        return ((torch.randint(0, vocab, (b, t), generator=g),), (torch.randint(0, vocab, (b, t), generator=g),))
    return f


def _images(b, hw, classes):
    def f(g):
        return ((torch.randn(b, 3, hw, hw, generator=g),), (torch.randint(0, classes, (b,), generator=g),))
    return f


def _seeded(cls, **kw):
    def f():
        torch.manual_seed(0)
        return cls(**kw)
    return f


def workloads(quick: bool = False) -> list[Workload]:
    """The benchmark workloads; quick=True gives miniatures with the same structure (for tests)."""
    if quick:
        lstm = dict(vocab=200, emb=16, hidden=24, proj=12)
        tr = dict(vocab=128, d=32, layers=2, heads=2, ffn=64, seq=8)
        cnn = dict(width=0.25, config=[(1, 8, 1, 1), (6, 12, 2, 2), (6, 16, 2, 2), (6, 24, 2, 2)],
                   last_channels=64)
        shapes = dict(lstm_big=(2, 6), lstm_small=(1, 4), tr=(2, 8), cnn=(2, 32))
    else:
        lstm = dict(vocab=10_000, emb=96, hidden=670, proj=96)
        tr = dict(vocab=8000, d=256, layers=4, heads=4, ffn=1024, seq=64)
        cnn = dict(width=1.0)
        shapes = dict(lstm_big=(4, 20), lstm_small=(1, 16), tr=(8, 64), cnn=(8, 128))
    lstm_schemes = {"full": lambda m: "full", "last": lambda m: {"fc.*": 1.0}, "sparse": lstm_sparse}
    out = []
    for tag in ("lstm_big", "lstm_small"):
        b, t = shapes[tag]
        out.append(Workload(f"lstm_b{b}s{t}", f"keyboard LSTM LM b{b}x{t}", _seeded(KeyboardLSTM, **lstm),
                            _tokens(lstm["vocab"], b, t), lstm_schemes))
    b, t = shapes["tr"]
    out.append(Workload(f"transformer_b{b}s{t}", f"keyboard transformer LM b{b}x{t}",
                        _seeded(KeyboardTransformer, **tr), _tokens(tr["vocab"], b, t),
                        {"full": lambda m: "full", "last": lambda m: {"head.*": 1.0}, "sparse": transformer_sparse}))
    b, hw = shapes["cnn"]
    out.append(Workload(f"mobilenetv2_b{b}r{hw}", f"MobileNetV2 b{b}x{hw}x{hw}", _seeded(MobileNetV2, **cnn),
                        _images(b, hw, 10),
                        {"full": lambda m: "full", "last": lambda m: {"classifier.*": 1.0}, "sparse": cnn_sparse}))
    return out


def resolve_partial(model: nn.Module, update) -> tuple[set, dict]:
    """update -> (names of trained parameters, {name: k}) for partial (first-k input channel)
    updates, with the contract's semantics (exact name beats a glob), for the PyTorch baselines."""
    import fnmatch
    names = dict(model.named_parameters())
    if update == "full":
        return set(names), {}
    chosen = {}
    for key, ratio in update.items():
        for n in ([key] if key in names else fnmatch.filter(names, key)):
            if key == n or n not in chosen:
                chosen[n] = ratio
    trained, partial = set(), {}
    for n, r in chosen.items():
        if r <= 0:
            continue
        trained.add(n)
        if r < 1:
            k = math.ceil(r * names[n].shape[1])
            if k < names[n].shape[1]:
                partial[n] = k
    return trained, partial
