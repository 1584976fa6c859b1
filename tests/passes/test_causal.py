"""passes/causal.py: a compile-time causal mask becomes sdpa's causal flag; other masks stay."""
import numpy as np
import torch
import torch.nn.functional as F

import pockengine as pe
from pockengine.passes.causal import is_causal_mask


def test_is_causal_mask_forms():
    L = 5
    tril = np.tril(np.ones((L, L), dtype=bool))
    assert is_causal_mask(tril, L, L)
    assert is_causal_mask(np.broadcast_to(tril, (2, 3, L, L)), L, L)
    fmin = np.where(tril, 0.0, np.finfo(np.float32).min).astype(np.float32)
    assert is_causal_mask(fmin, L, L)
    assert is_causal_mask(np.where(tril, 0.0, -np.inf).astype(np.float32), L, L)
    padded = tril.copy()
    padded[:, 0] = False  # a padding mask on top: not causal any more
    assert not is_causal_mask(padded, L, L)
    assert not is_causal_mask(np.where(tril, 0.5, -np.inf).astype(np.float32), L, L)  # a bias, not a mask
    assert not is_causal_mask(np.tril(np.ones((L, L), dtype=bool), k=1), L, L)
    assert not is_causal_mask(np.ones((L, L), dtype=bool), L, L)


class Attn(torch.nn.Module):
    def __init__(self, mask):
        super().__init__()
        self.qkv = torch.nn.Linear(8, 24)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x):
        q, k, v = self.qkv(x).reshape(2, 6, 3, 8).permute(2, 0, 1, 3)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask)


def test_constant_causal_mask_becomes_the_causal_flag_and_trains_the_same():
    torch.manual_seed(0)
    x, y = torch.randn(2, 6, 8), torch.randn(2, 6, 8)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    window = causal & ~torch.ones(6, 6, dtype=torch.bool).tril(-3)  # a sliding window: kept as a mask
    for mask, flag in ((causal, True), (window, False)):
        model = Attn(mask)
        ref = Attn(mask)
        ref.load_state_dict(model.state_dict())
        prog = pe.compile(model, (x,), (y,), loss="mse", optimizer=pe.SGD(lr=0.1))
        sdpa = [n for n in prog.graph.nodes if n.op == "sdpa"]
        assert len(sdpa) == 1 and sdpa[0].attrs["causal"] is flag and (sdpa[0].inputs[3] is None) is flag
        trainer = prog.build()
        opt = torch.optim.SGD(ref.parameters(), lr=0.1)
        for _ in range(2):
            loss = F.mse_loss(ref(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            assert abs(trainer.step((x,), (y,)) - loss.item()) < 1e-5
        np.testing.assert_allclose(trainer.state_dict()["qkv.weight"], ref.qkv.weight.detach().numpy(),
                                   rtol=1e-5, atol=1e-6)
