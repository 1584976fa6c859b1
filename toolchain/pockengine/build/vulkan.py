"""Build helpers for models with a Vulkan partition: GLSL compute shaders to
SPIR-V with `glslc` (cached by content hash under POCK_CACHE_DIR/spirv, like
build/host.py's objects), and the extra sources and link flags of the
Vulkan runtime (native/runtime/vulkan/)."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from ..errors import PockError
from .host import _locked, cache_dir, runtime_dir

LINK_FLAGS = ("-lvulkan",)


def vulkan_dir() -> Path:
    return runtime_dir() / "vulkan"


def shader_dir() -> Path:
    return vulkan_dir() / "shaders"


def runtime_sources() -> list[Path]:
    return sorted(vulkan_dir().glob("*.cpp"))


def glslc() -> str:
    exe = shutil.which("glslc")
    if exe is None:
        raise PockError("glslc not found: the Vulkan backend compiles its shaders with it "
                        "(Debian: apt-get install glslc), or build with backends=['cpu']")
    return exe


# Every conformant device binds 2**27 bytes in one storage-buffer descriptor (the spec's minimum
# maxStorageBufferRange); a step needing more device memory is seen through several windows.
DEFAULT_WINDOW_BYTES = 1 << 27
MAX_WINDOW_BYTES = 1 << 30   # a window's words must fit the 28 bits below the window index
MAX_WINDOWS = 8              # bindings in common.glsl


def window_bytes() -> int:
    """The most bytes one shader binding covers: POCK_VK_MAX_BUFFER_BYTES (read when the model
    is built; e.g. 4096 to exercise the split on a small model, or 1073741824 on a GPU that
    binds that much), else 2**27."""
    raw = os.environ.get("POCK_VK_MAX_BUFFER_BYTES", "").strip()
    if not raw:
        return DEFAULT_WINDOW_BYTES
    try:
        n = int(raw, 0)
    except ValueError:
        raise PockError(f"POCK_VK_MAX_BUFFER_BYTES={raw!r} is not a number of bytes") from None
    if not 1024 <= n <= MAX_WINDOW_BYTES:
        raise PockError(f"POCK_VK_MAX_BUFFER_BYTES={n} is outside [1024, {MAX_WINDOW_BYTES}]")
    return n


def compile_shader(name: str, windows: int = 1) -> list[int]:
    """SPIR-V words of shaders/<name>.comp (with the headers beside it), reading device
    memory through `windows` bindings (common.glsl's POCK_WINDOWS)."""
    src = shader_dir() / f"{name}.comp"
    if not src.is_file():
        raise PockError(f"no Vulkan shader {str(src)!r}")
    h = hashlib.sha256()
    for p in [src, *sorted(shader_dir().glob("*.glsl"))]:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    defines = [f"-DPOCK_WINDOWS={windows}"] if windows > 1 else []
    h.update(" ".join(defines).encode())
    out = cache_dir() / "spirv" / f"{name}-{h.hexdigest()[:24]}.spv"
    if not out.exists():
        with _locked(out):
            if not out.exists():
                tmp = out.with_name(out.name + ".tmp")
                r = subprocess.run([glslc(), "-O", "--target-env=vulkan1.0", "-I", str(shader_dir()), *defines, str(src),
                                    "-o", str(tmp)], capture_output=True, text=True)
                if r.returncode != 0:
                    raise PockError(f"glslc failed on {src.name}:\n{(r.stderr or r.stdout)[-4000:]}")
                tmp.replace(out)
    data = out.read_bytes()
    return [int.from_bytes(data[i:i + 4], "little") for i in range(0, len(data), 4)]
