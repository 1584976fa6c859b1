"""PockEngine: compile a PyTorch model's whole training step to C++."""
from .errors import PockError
from .lora import LoRA
from .optim import SGD, AdamW
from .program import Program, compile
from .search import Budget, search_update

__version__ = "0.1.0"
__all__ = ["compile", "Program", "SGD", "AdamW", "PockError", "LoRA", "Budget", "search_update", "__version__"]
