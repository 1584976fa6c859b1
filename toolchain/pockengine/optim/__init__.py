from .optimizers import SGD, AdamW, Optimizer

__all__ = ["SGD", "AdamW", "Optimizer"]
