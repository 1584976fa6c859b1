import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "toolchain"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("POCK_CACHE_DIR", str(ROOT / ".cache" / "pockengine"))
