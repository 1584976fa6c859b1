"""Update schemes: LoRA adapters (lora.py) and low-precision frozen weights (quant.py)."""
