"""python -m pockengine.backends [--check]: write the headers generated from the backends'
tables (today: the Vulkan shaders' op codes, backends/vulkan_ops.py -> op_codes.glsl);
--check exits 1, naming the file, when a checked-in header is out of date."""
import sys

from .vulkan_ops import HEADER, header


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = header()
    if "--check" in argv:
        if not HEADER.is_file() or HEADER.read_text() != text:
            print(f"{HEADER} is out of date: run python -m pockengine.backends", file=sys.stderr)
            return 1
        return 0
    HEADER.write_text(text)
    print(f"wrote {HEADER}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
