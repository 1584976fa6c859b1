"""PockTokenizer.swift cannot be compiled here (no swiftc), so, as test_swift_sdk.py does for
PockTrainer, it is held to being a one-to-one wrapper: every pock_ call it makes is declared
in pock.h, each public member wraps the expected C function, and its argument counts match
the declarations."""
import re

from pockengine.codegen import RUNTIME_DIR
from pockengine.platforms.ios import SDK_DIR

SOURCE = (SDK_DIR / "Sources" / "PockEngine" / "PockTokenizer.swift").read_text()
POCK_H = (RUNTIME_DIR / "include" / "pock.h").read_text()
DECLS = {m.group(1): m.group(2) for m in re.finditer(r"POCK_API\s+[\w\s\*]+?\b(pock_tokenizer_\w+)\s*\(([^;]*)\);",
                                                     POCK_H)}
WRAPS = {"init(contentsOf": "pock_tokenizer_open", "init(data": "pock_tokenizer_open_memory",
         "func encode(": "pock_tokenizer_encode", "func decode(": "pock_tokenizer_decode",
         "func tokenToId(": "pock_tokenizer_token_to_id", "func close(": "pock_tokenizer_close"}


def calls(code: str) -> list[tuple[str, int]]:
    """(pock_ function, argument count) of every call in code (arguments split at top-level commas)."""
    out = []
    for m in re.finditer(r"\b(pock_\w+)\(", code):
        depth, i, args = 1, m.end(), 1
        while depth:
            c = code[i]
            depth += {"(": 1, ")": -1}.get(c, 0)
            args += c == "," and depth == 1
            i += 1
        empty = code[m.end():i - 1].strip() == ""
        out.append((m.group(1), 0 if empty else args))
    return out


def test_every_call_is_declared_with_its_argument_count():
    made = calls(SOURCE)
    assert made
    for name, n in made:
        if name == "pock_last_error":
            continue
        assert name in DECLS, f"{name} is not declared in pock.h"
        assert n == len(DECLS[name].split(",")), f"{name}: {n} arguments, pock.h declares {DECLS[name]}"


def test_public_members_wrap_their_c_function():
    for member, fn in WRAPS.items():
        start = SOURCE.index(member)
        body = SOURCE[start:SOURCE.index("\n    }\n", start)]
        assert fn + "(" in body, f"{member} does not call {fn}"
    assert "pock_tokenizer_close(handle)" in SOURCE[SOURCE.index("deinit"):]
