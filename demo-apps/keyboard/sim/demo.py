"""`make demo` (`cd demo-apps && python -m keyboard.sim.demo`): the keyboard personalization simulation.

A base next-word model pretrained on generic English (Debian's `fortunes`) is fine-tuned,
through PockEngine's compiled C++ training step, on one user's typed sentences (legal
prose) arriving in rounds, with a full update and with the app's sparse scheme; it prints
top-1/top-3 accuracy on the user's held-out sentences before and after, the training
memory and time per step, and writes out/keyboard_personalization.png. Then smart compose
(sim/smart_compose.py): SmolLM2-135M personalized with LoRA on the same user through the C API
the apps call (tokenizer -> step -> generate), beside the LSTM model (--no-smart-compose skips it).

The model is model/lm.py's KeyboardLM; the simulation is simulate.py.  This runner imports
the library; the library imports nothing from demo-apps/.  `--model smollm2` runs
pockengine.demo_llm on this demo's user text instead.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # the checkout


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--model" in argv or any(a.startswith("--model=") for a in argv):
        from pockengine.demo_llm import main as llm_main  # --model smollm2
        return llm_main(argv, corpus=ROOT / "demo-apps" / "keyboard" / "data" / "corpus.txt")
    ap = argparse.ArgumentParser(prog="python -m keyboard.sim.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6, help="rounds in which the user's text arrives")
    ap.add_argument("--out", default=str(ROOT / "out" / "keyboard_personalization.png"))
    ap.add_argument("--search-mb", type=float, default=None,
                    help="also run a scheme found by pe.search_update for this training-memory budget (MiB)")
    ap.add_argument("--no-smart-compose", dest="smart_compose", action="store_false",
                    help="skip the SmolLM2 smart-compose part (sim/smart_compose.py)")
    args, rest = ap.parse_known_args(argv)
    from ..model import lm
    from . import simulate as sim
    schemes = {"full": "full", "sparse": lm.SPARSE_UPDATE}
    if args.search_mb:
        import pockengine as pe
        schemes["searched"] = pe.search_update(lm.load_base(), sim.sample_batches(), loss="cross_entropy",
                                               optimizer=pe.AdamW(lr=3e-3, weight_decay=0.0),
                                               budget=pe.Budget(memory_mb=args.search_mb))
    meta = lm.base_meta()
    print(f"base model: KeyboardLM, {lm.VOCAB} words, embedding {lm.EMB}, LSTM {lm.HIDDEN} "
          f"({lm.WEIGHTS.relative_to(ROOT)}, fp16)")
    print(f"  pretrained on {meta.get('corpus', '?')}: {meta.get('train_tokens', '?')} tokens, "
          f"{meta.get('steps', '?')} steps, validation loss {meta.get('val_loss', '?')}")
    print(f"user text: {sim.corpora.USER_TEXT.relative_to(ROOT)} (GPL-3, Apache-2.0, GFDL-1.3 from "
          f"Debian's common-licenses), sentences split into typed / held-out blocks")
    t0 = time.time()
    result = sim.simulate(rounds=args.rounds, schemes=schemes)
    print("\n" + sim.table(result))
    full, sparse = (r.curve[-1][2] for r in result["runs"][:2])
    print(f"\ntop-3 lift over the base model: full {100 * (full - result['base'][1]):+.1f} points, "
          f"sparse {100 * (sparse - result['base'][1]):+.1f} points "
          f"(sparse - full: {100 * (sparse - full):+.1f} points); batch {lm.BATCH} x {lm.SEQ} words, AdamW")
    lift, gap = 100 * (sparse - result["base"][1]), 100 * (full - sparse)
    print(f"personalization lifts top-3 by >= 5 points: {'yes' if lift >= 5 else 'NO'}; "
          f"sparse within 2 points of full: {'yes' if gap <= 2 else 'NO'}")
    path = sim.plot(result, Path(args.out))
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    print(f"curves: {shown}  ({time.time() - t0:.0f}s)")
    if args.smart_compose:
        from . import smart_compose
        print("\nSmart compose: the same user with SmolLM2-135M (LoRA), next to the LSTM keyboard model")
        smart_compose.main(rest, lstm=result)


if __name__ == "__main__":
    import pockengine as pe
    try:
        main()
    except pe.PockError as e:
        sys.exit(f"keyboard.sim.demo: error: {e}")
