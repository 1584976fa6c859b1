"""pe.Tokenizer: the runtime's C++ tokenizer (native/runtime/tokenizer, pock.h's
pock_tokenizer_*) through ctypes, from a standalone library built once into the
build cache, plus chat data for fine-tuning (chat_batch).

    tok = pe.Tokenizer.from_pretrained("SmolLM2.gguf")   # or a tokenizer.json / its folder
    ids = tok.encode("Hello")                              # the ids Hugging Face gives
    tok.decode(ids) == "Hello"
    input_ids, labels = tok.chat_batch(conversations, seq_len=128)
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import PockError
from .handle import NativeHandle, bind, check

IGNORE_INDEX = -100


def _sources() -> list[Path]:
    from ..build.host import runtime_dir
    tok = runtime_dir() / "tokenizer"
    return [*sorted(tok.glob("*.cpp")), tok / "standalone" / "last_error.cpp"]


@functools.lru_cache(maxsize=None)
def library_path() -> Path:
    """libpock_tokenizer (the tokenizer sources and a last-error shim, no model), built
    into the host build cache with the runtime's flags; rebuilt when a source changes."""
    from ..build import host
    rt = host.runtime_dir()
    cxx = host.compiler()
    flags = (*host.BASE_FLAGS, *host.march_flags(), "-I", str(rt / "include"), "-I", str(rt))
    headers = host._digest(sorted(rt.rglob("*.h")))
    objs = [str(o) for o in host.compile_objects([(s, flags, headers) for s in _sources()], cxx)]
    key = hashlib.sha256("\0".join([*cxx, *objs, *flags]).encode()).hexdigest()[:24]
    return host._produce(host.cache_dir() / "lib" / f"libpock_tokenizer-{key}.so",
                         lambda tmp: [*cxx, "-shared", *flags, *objs, "-o", str(tmp)], "linking the tokenizer")


_i32p = ctypes.POINTER(ctypes.c_int32)


@functools.lru_cache(maxsize=None)
def _lib() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(library_path()))
    vp, i32, i64, c_int = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64, ctypes.c_int
    return bind(lib, {  # {name: (restype, argtypes)}
        "pock_last_error": (ctypes.c_char_p, []),
        "pock_tokenizer_open": (c_int, [ctypes.c_char_p, ctypes.POINTER(vp)]),
        "pock_tokenizer_open_memory": (c_int, [ctypes.c_char_p, i64, ctypes.POINTER(vp)]),
        "pock_tokenizer_close": (None, [vp]),
        "pock_tokenizer_encode": (c_int, [vp, ctypes.c_char_p, i64, i32, ctypes.POINTER(_i32p),
                                          ctypes.POINTER(i64)]),
        "pock_tokenizer_decode": (c_int, [vp, _i32p, i64, i32, ctypes.POINTER(vp), ctypes.POINTER(i64)]),
        "pock_tokenizer_vocab_size": (c_int, [vp, _i32p]),
        "pock_tokenizer_special_ids": (c_int, [vp, _i32p, _i32p, _i32p]),
        "pock_tokenizer_token_to_id": (c_int, [vp, ctypes.c_char_p, i64, _i32p]),
        "pock_tokenizer_id_to_token": (c_int, [vp, i32, ctypes.POINTER(vp), ctypes.POINTER(i64)]),
        "pock_tokenizer_is_special": (c_int, [vp, i32, _i32p]),
        "pock_tokenizer_chat_template": (c_int, [vp, ctypes.POINTER(vp), ctypes.POINTER(i64)]),
    })


def _check(status: int) -> None:
    check(_lib(), status)


class Tokenizer(NativeHandle):
    """Text <-> token ids with the runtime's tokenizer (see pock.h).  One lock per
    tokenizer serialises its calls, so it may be shared between threads (handle.py)."""

    _closed_message = "the tokenizer is closed"

    def __init__(self, handle: ctypes.c_void_p, source: str):
        super().__init__()
        self._handle = handle
        self.source = source
        lib = _lib()
        n, bos, eos, pad = ctypes.c_int32(), ctypes.c_int32(), ctypes.c_int32(), ctypes.c_int32()
        _check(lib.pock_tokenizer_vocab_size(handle, ctypes.byref(n)))
        _check(lib.pock_tokenizer_special_ids(handle, ctypes.byref(bos), ctypes.byref(eos), ctypes.byref(pad)))
        self.vocab_size = n.value
        self.bos_id = bos.value if bos.value >= 0 else None
        self.eos_id = eos.value if eos.value >= 0 else None
        self.pad_id = pad.value if pad.value >= 0 else None

    @classmethod
    def from_pretrained(cls, path_or_gguf) -> "Tokenizer":
        """A folder holding tokenizer.json (and tokenizer_config.json), a tokenizer.json
        file, or a .gguf file."""
        path = os.fspath(path_or_gguf)
        h = ctypes.c_void_p()
        _check(_lib().pock_tokenizer_open(os.fsencode(path), ctypes.byref(h)))
        return cls(h, path)

    @classmethod
    def from_bytes(cls, data: bytes) -> "Tokenizer":
        """The bytes of a tokenizer.json or a GGUF file."""
        h = ctypes.c_void_p()
        _check(_lib().pock_tokenizer_open_memory(bytes(data), len(data), ctypes.byref(h)))
        return cls(h, "<bytes>")

    def encode(self, text: str | bytes, add_special_tokens: bool = True) -> list[int]:
        """Token ids of text (str, or UTF-8 bytes: invalid sequences read as U+FFFD).
        add_special_tokens: the tokenizer's post-processor tokens (Llama-2's BOS; none for
        SmolLM2), as Hugging Face's encode does."""
        if isinstance(text, str):
            try:
                data = text.encode("utf-8")
            except UnicodeEncodeError as e:
                raise PockError(f"encode: text is not valid Unicode ({e.reason} at index {e.start})") from None
        elif isinstance(text, (bytes, bytearray, memoryview)):
            data = bytes(text)
        else:
            raise PockError(f"encode: text must be str or bytes, got {type(text).__name__}")
        ids, n = _i32p(), ctypes.c_int64()
        with self._lock:
            _check(_lib().pock_tokenizer_encode(self._live(), data, len(data), int(add_special_tokens),
                                                ctypes.byref(ids), ctypes.byref(n)))
            if n.value == 0:
                return []
            return np.ctypeslib.as_array(ids, shape=(n.value,)).tolist()

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of ids; an id outside the vocabulary raises PockError naming it."""
        try:
            arr = np.asarray(ids, dtype=np.int64).reshape(-1)
        except (TypeError, ValueError, OverflowError):
            raise PockError("decode: ids must be a sequence of integers") from None
        bad = np.nonzero((arr < 0) | (arr >= self.vocab_size))[0]
        if len(bad):
            raise PockError(f"decode: token id {int(arr[bad[0]])} at position {int(bad[0])} is outside the "
                            f"vocabulary (size {self.vocab_size})")
        arr32 = np.ascontiguousarray(arr, dtype=np.int32)
        text, n = ctypes.c_void_p(), ctypes.c_int64()
        with self._lock:
            _check(_lib().pock_tokenizer_decode(self._live(), arr32.ctypes.data_as(_i32p), len(arr32),
                                                int(skip_special_tokens), ctypes.byref(text), ctypes.byref(n)))
            return ctypes.string_at(text.value, n.value).decode("utf-8", "replace") if n.value else ""

    def token_to_id(self, token: str) -> int | None:
        data = token.encode("utf-8", "surrogatepass")
        out = ctypes.c_int32()
        with self._lock:
            _check(_lib().pock_tokenizer_token_to_id(self._live(), data, len(data), ctypes.byref(out)))
        return out.value if out.value >= 0 else None

    def id_to_token(self, id: int) -> str:
        text, n = ctypes.c_void_p(), ctypes.c_int64()
        with self._lock:
            _check(_lib().pock_tokenizer_id_to_token(self._live(), int(id), ctypes.byref(text), ctypes.byref(n)))
            return ctypes.string_at(text.value, n.value).decode("utf-8", "replace")

    def is_special(self, id: int) -> bool:
        out = ctypes.c_int32()
        with self._lock:
            _check(_lib().pock_tokenizer_is_special(self._live(), int(id), ctypes.byref(out)))
        return bool(out.value)

    @property
    def chat_template(self) -> str | None:
        """The tokenizer's own Jinja chat template (tokenizer_config.json or GGUF), or None."""
        text, n = ctypes.c_void_p(), ctypes.c_int64()
        with self._lock:
            _check(_lib().pock_tokenizer_chat_template(self._live(), ctypes.byref(text), ctypes.byref(n)))
            return ctypes.string_at(text.value, n.value).decode("utf-8", "replace") if n.value else None

    def chat_batch(self, conversations, seq_len: int, ignore_index: int = IGNORE_INDEX):
        from .chat import chat_batch
        return chat_batch(self, conversations, seq_len, ignore_index)

    def _release(self, handle) -> None:
        _lib().pock_tokenizer_close(handle)

    def __repr__(self) -> str:
        return f"Tokenizer({self.source!r}, vocab_size={self.vocab_size})"
