"""The Keras frontend's cases (keras_cases.py) run in a child pytest process: TensorFlow
loads its own LLVM, and once it is in a process Mesa lavapipe's LLVM crashes that process
in a later Vulkan test (a segfault in vkCreateComputePipelines under pytest-xdist)."""
from pathlib import Path

from helpers import run_pytest_in_child

HERE = Path(__file__).resolve().parent


def test_keras_frontend_cases_in_their_own_process():
    run_pytest_in_child(HERE / "keras_cases.py")
