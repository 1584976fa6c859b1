"""The keyboard demo's federated task: its base model (pretrained on Debian's fortunes) compiled
with the app's sparse scheme (or a full update) exactly as `pock-build ...spec.py:make_base` does,
the keyboard tokenizer, and the keyboard's top-1/top-3 next-word evaluation (simulate.py).

    cd demo-apps && python -m pockengine.federated simulate --task keyboard.sim.federated:task \\
        --clients 8 --rounds 5

(`pockengine.federated` imports no demo: it imports this module by the name given.)
"""
from __future__ import annotations

import pockengine as pe
from pockengine.federated.simulate import Task

from ..model import lm, spec
from ..model.tokenizer import Tokenizer
from .simulate import evaluate


def task(scheme: str = "sparse") -> Task:
    update = {"sparse": lm.SPARSE_UPDATE, "full": "full"}.get(scheme)
    if update is None:
        raise pe.PockError(f"--scheme must be 'sparse' or 'full', got {scheme!r}")
    return Task(pe.compile(**spec.make_base(update=update)), Tokenizer.load(), evaluate, lm.BATCH, lm.SEQ)
