"""The small model the iOS tests build (a few hundred parameters)."""
import torch

import pockengine as pe


class TinyTagger(torch.nn.Module):
    """Embedding -> ReLU -> Linear: a next-token model of a few hundred parameters."""

    def __init__(self, vocab=20, dim=8):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.fc = torch.nn.Linear(dim, vocab)

    def forward(self, x):
        return self.fc(torch.relu(self.emb(x)))


def tiny_spec():
    torch.manual_seed(0)
    x = torch.randint(0, 20, (2, 4))
    y = torch.randint(0, 20, (2, 4))
    return {"model": TinyTagger(), "example_inputs": (x,), "example_targets": (y,),
            "loss": "cross_entropy", "optimizer": pe.SGD(lr=0.1, momentum=0.9), "name": "tiny_tagger"}
