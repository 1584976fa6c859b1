# The tokenizer tests' session fixtures; everything shared lives in tok_corpora.py (a unique
# module name: `from conftest import ...` would find another directory's conftest).
from tok_corpora import smollm2_dir, trained  # noqa: F401
