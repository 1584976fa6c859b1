"""Small models for end-to-end tests (each a miniature of a real workload)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 5))

    def forward(self, x):
        return self.net(x)


class TinyMobileNet(nn.Module):
    """Stem conv + BN + ReLU6, an inverted-residual block with a depthwise conv, pooling, classifier."""

    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False)
        self.bn0 = nn.BatchNorm2d(8)
        self.expand = nn.Conv2d(8, 16, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.project = nn.Conv2d(16, 8, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, classes)

    def forward(self, x):
        x = F.relu6(self.bn0(self.stem(x)))
        h = F.relu6(self.bn1(self.expand(x)))
        h = F.relu6(self.bn2(self.dw(h)))
        x = x + self.bn3(self.project(h))
        x = F.max_pool2d(x, 2)
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        # no qkv bias: the key bias has an exactly-zero gradient (softmax is shift invariant), so
        # both frameworks would hold only rounding noise there, which AdamW amplifies to +-lr
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    """GPT-style LM with tied input/output embeddings."""

    def __init__(self, vocab=64, d=32, layers=2, heads=2, seq=8):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight
        nn.init.normal_(self.tok.weight, std=0.02)  # GPT-2's init: unsaturated softmax, well-conditioned grads

    def forward(self, idx):
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


class LSTMLM(nn.Module):
    def __init__(self, vocab=50, emb=16, hidden=24, layers=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb)
        self.lstm = nn.LSTM(emb, hidden, num_layers=layers, batch_first=True)
        self.fc = nn.Linear(hidden, vocab)

    def forward(self, idx):
        h, _ = self.lstm(self.emb(idx))
        return self.fc(h)


def batches(name, n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    if name == "mlp":
        return [((torch.randn(8, 16, generator=g),), (torch.randint(0, 5, (8,), generator=g),)) for _ in range(n)]
    if name == "cnn":
        return [((torch.randn(4, 3, 16, 16, generator=g),), (torch.randint(0, 10, (4,), generator=g),))
                for _ in range(n)]
    if name == "gpt":
        return [((torch.randint(0, 64, (2, 8), generator=g),), (torch.randint(0, 64, (2, 8), generator=g),))
                for _ in range(n)]
    return [((torch.randint(0, 50, (3, 6), generator=g),), (torch.randint(0, 50, (3, 6), generator=g),))
            for _ in range(n)]


MODELS = {"mlp": MLP, "cnn": TinyMobileNet, "gpt": GPT, "lstm": LSTMLM}
SPARSE = {
    "mlp": {"net.0.weight": 0.5, "net.4.*": 1.0},
    "cnn": {"project.weight": 0.5, "bn3.*": 1.0, "fc.*": 1.0},
    "gpt": {"blocks.1.qkv.weight": 0.5, "blocks.1.fc1.*": 1.0, "blocks.1.ln*": 1.0,
            "ln_f.*": 1.0, "tok.weight": 0.25},
    "lstm": {"lstm.weight_ih_l1": 0.5, "lstm.weight_hh_l1": 0.5, "lstm.bias_*_l1": 1.0, "fc.weight": 0.5,
             "fc.bias": 1.0},
}


def rotate_half(x):  # transformers' Llama rotate_half, verbatim in substance
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class Rotary(nn.Module):
    """q/k projections, heads, then apply_rotary_pos_emb with fixed cos/sin tables."""

    def __init__(self, d=24, heads=3, kv_heads=1, T=5, per_batch=False):
        super().__init__()
        self.q, self.k = nn.Linear(d, d), nn.Linear(d, d // heads * kv_heads)
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        inv = 1.0 / (10000 ** (torch.arange(0, self.hd, 2).float() / self.hd))
        pos = torch.arange(T).float()
        if per_batch:  # position ids differ per batch row: cos/sin [B, 1, T, D]
            pos = torch.stack([pos, pos + 3.0])
        freqs = pos[..., None] * inv
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos().unsqueeze(-3), persistent=False)
        self.register_buffer("sin", emb.sin().unsqueeze(-3), persistent=False)

    def forward(self, x):
        B, T, _ = x.shape
        q = self.q(x).view(B, T, self.heads, self.hd).transpose(1, 2)
        k = self.k(x).view(B, T, self.kv_heads, self.hd).transpose(1, 2)
        q = q * self.cos + rotate_half(q) * self.sin
        k = (rotate_half(k) * self.sin) + (self.cos * k)
        return (q.sum(1) * k.sum(1)).reshape(B, T, -1)
