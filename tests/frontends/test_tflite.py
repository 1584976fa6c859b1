"""The TFLite frontend's cases (tflite_cases.py) run in a child pytest process: TensorFlow makes
the files and runs the interpreter there, and TensorFlow's LLVM cannot share a process with
Mesa lavapipe's (see test_keras.py). Compiling a .tflite itself never imports TensorFlow."""
import subprocess
import sys
from pathlib import Path

from helpers import run_pytest_in_child

HERE = Path(__file__).resolve().parent


def test_tflite_frontend_cases_in_their_own_process():
    run_pytest_in_child(HERE / "tflite_cases.py")


def test_compiling_a_tflite_never_imports_tensorflow(tmp_path):
    code = ("import sys, pockengine.frontends.tflite as t\n"
            "try:\n    t.TFLiteModule(b'\\x00' * 64)\nexcept Exception as e:\n    print(type(e).__name__)\n"
            "print('tensorflow' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=HERE.parents[1] / "toolchain")
    assert r.stdout.split() == ["PockError", "False"], r.stdout + r.stderr
