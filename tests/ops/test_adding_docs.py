"""docs/adding_an_op.md states the files that name an op (swiglu), docs/adding_a_backend.md
those that name a backend (reference) and the Vulkan backend's segments: the tree is grepped
and must name exactly those files."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "adding_an_op.md"
BACKEND_DOC = ROOT / "docs" / "adding_a_backend.md"
SUFFIXES = {".py", ".h", ".cpp", ".comp", ".glsl", ".j2", ".txt", ".cmake", ".toml", ".kt", ".swift", ".mm"}


def stated(marker: str, doc: Path = DOC) -> set[str]:
    text = doc.read_text()
    block = text.split(f"<!-- {marker} -->", 1)[1].split("<!-- end -->", 1)[0]
    return set(re.findall(r"^- `([^`]+)`", block, re.M))


def naming(pattern: str) -> set[str]:
    rx = re.compile(pattern)
    found = set()
    for top in ("toolchain", "native"):
        for p in (ROOT / top).rglob("*"):
            if p.is_file() and p.suffix in SUFFIXES and "__pycache__" not in p.parts and \
                    not any(part.endswith(".egg-info") for part in p.parts) and \
                    not p.is_symlink() and not any(q.is_symlink() for q in p.parents if ROOT in q.parents):
                if rx.search(p.read_text(errors="replace")):
                    found.add(str(p.relative_to(ROOT)))
    return found


def test_files_naming_an_op_are_the_documented_ones():
    assert naming(r"\bswiglu\b") == stated("files naming swiglu")


def test_files_naming_a_backend_are_the_documented_ones():
    assert naming(r"\"reference\"|\bimport reference\b|backends\.reference\b") == \
        stated("files naming the reference backend", BACKEND_DOC)


def test_the_stated_count_of_files_naming_layer_norm():
    text = DOC.read_text().split("`grep -rlw layer_norm toolchain native`", 1)[1]
    stated_after = int(re.search(r"\*\*After: (\d+) files\.\*\*", text).group(1))
    assert len(naming(r"\blayer_norm\b")) == stated_after


def test_files_naming_the_vulkan_segments_are_the_documented_ones():
    assert naming(r"\bVulkanSegments\b|vulkan\.cpp\.j2") == stated("files naming the vulkan segments", BACKEND_DOC)
