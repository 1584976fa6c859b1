"""The templates (native/templates): model.cpp.j2 is the one step template and names no
backend; a step backend's template extends it and overrides only blocks it declares."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "native" / "templates"
BLOCK = re.compile(r"\{%-?\s*block\s+(\w+)")


def test_model_template_names_no_backend():
    text = (TEMPLATES / "model.cpp.j2").read_text()
    assert "vulkan" not in text.lower()
    assert "is defined" not in text  # no backend branches: a backend overrides blocks instead
    assert not re.search(r"\bpvk::|\bvk\b", text)


def test_backend_templates_extend_model_and_override_its_blocks():
    base = set(BLOCK.findall((TEMPLATES / "model.cpp.j2").read_text()))
    children = [p for p in TEMPLATES.glob("*.cpp.j2") if p.name != "model.cpp.j2"]
    assert "vulkan.cpp.j2" in [p.name for p in children]
    for p in children:
        text = p.read_text()
        assert '{% extends "model.cpp.j2" %}' in text
        own = set(BLOCK.findall(text))
        assert own and own <= base, f"{p.name} overrides blocks model.cpp.j2 does not declare: {own - base}"
