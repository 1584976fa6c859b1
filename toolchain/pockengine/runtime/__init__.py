"""The runtime side in Python: the Trainer over a compiled library (trainer.py), checkpoints
(checkpoint.py, trained_ckpt.py), bundles, profiles, the tokenizer and chat data, adapter export."""
