"""The Keras frontend's cases (keras_cases.py) run in a child pytest process: TensorFlow
loads its own LLVM, and once it is in a process Mesa lavapipe's LLVM crashes that process
in a later Vulkan test (a segfault in vkCreateComputePipelines under pytest-xdist)."""
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_keras_frontend_cases_in_their_own_process():
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE / "keras_cases.py")],
                       capture_output=True, text=True, timeout=1800, cwd=HERE.parents[1])
    assert r.returncode == 0, f"keras_cases.py failed:\n{r.stdout[-6000:]}\n{r.stderr[-2000:]}"
    assert " passed" in r.stdout and " failed" not in r.stdout, r.stdout[-2000:]
