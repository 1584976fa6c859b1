"""The Vulkan op codes are defined once (backends/vulkan_ops.py) and reach GLSL through the
generated op_codes.glsl: the checked-in header is up to date, the shaders switch on its
names (no magic numbers), and every code the emitters send has a case."""
import re
import shutil

import pytest

from pockengine.backends.__main__ import main
from pockengine.backends.vulkan import GRAD, UNARY
from pockengine.backends.vulkan_ops import BACKWARD_BASE, BINARY, HEADER, POINTWISE, glsl_name, header

SHADERS = HEADER.parent


def test_checked_in_header_is_up_to_date():
    assert HEADER.read_text() == header(), "run: python -m pockengine.backends"
    assert main(["--check"]) == 0


def test_codes_are_distinct_and_split_forward_backward():
    assert len(set(POINTWISE.values())) == len(POINTWISE) and len(set(BINARY.values())) == len(BINARY)
    for op, code in POINTWISE.items():
        assert (code >= BACKWARD_BASE) == op.endswith("_bwd"), op
    assert {**UNARY, **GRAD}.items() <= POINTWISE.items()  # the emitters' tables are views


@pytest.mark.parametrize("shader, prefix, table", [("pointwise.comp", "PW", POINTWISE), ("binary.comp", "BIN", BINARY)])
def test_shaders_use_the_generated_names(shader, prefix, table):
    text = (SHADERS / shader).read_text()
    assert '#include "op_codes.glsl"' in text
    assert not re.search(r"case\s+\d+u?\s*:", text), f"{shader} switches on a magic number"
    cases = set(re.findall(rf"case\s+({prefix}_\w+)\s*:", text))
    names = {glsl_name(prefix, op) for op in table}
    assert cases <= names
    missing = names - cases
    assert missing <= {"BIN_DIV"}, f"{shader} has no case for {sorted(missing)}"  # div: binary.comp's default
    if missing:
        assert re.search(r"default:.*// BIN_DIV", text)


@pytest.mark.skipif(shutil.which("glslc") is None, reason="glslc not installed")
@pytest.mark.parametrize("shader", ["pointwise", "binary"])
def test_shaders_compile_with_the_header(shader):
    from pockengine.build.vulkan import compile_shader
    assert compile_shader(shader)
