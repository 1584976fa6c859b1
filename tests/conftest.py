import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "toolchain"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("POCK_CACHE_DIR", str(ROOT / ".cache" / "pockengine"))


def pytest_collection_modifyitems(config, items):
    """Tests that load coremltools (tests/sdk_ios) run after every other test: once coremltools'
    native libraries are in a process, a later Vulkan (lavapipe) step in that process segfaults
    (seen with sdk_ios/test_coreml.py then backends/test_reference.py[vulkan] in one pytest).
    pytest-xdist hands each worker tests in collection order, so no worker runs Vulkan after them.
    (TensorFlow has the same problem; its cases run in a child process: helpers.run_pytest_in_child.)"""
    items.sort(key=lambda item: "sdk_ios" in item.path.parts)  # stable: the rest keep their order
