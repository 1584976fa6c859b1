"""PockEngine: compile a PyTorch model's whole training step to C++."""
from .errors import PockError
from .schemes.lora import LoRA
from .optim import SGD, AdamW
from .compiler.program import Program, compile
from .frontends.onnx import export_onnx
from .frontends.jax import from_jax, jax_params
from .frontends.keras import export_keras
from .frontends.tflite import export_tflite
from .search import Budget, search_update
from .runtime.tokenizer import Tokenizer

__version__ = "0.1.0"
__all__ = ["compile", "export_onnx", "from_jax", "jax_params", "export_keras", "export_tflite", "Program", "SGD", "AdamW", "PockError",
           "LoRA", "Budget", "search_update", "Tokenizer", "__version__"]
