"""NativeHandle: the lifetime of one C object held over ctypes (a trainer, a tokenizer).

A subclass stores the C handle in self._handle once it is open and says how to free it
(_release) and what to call itself when used after close (_closed_message).  The base
gives every handle the same rules:

  * one re-entrant lock per object: hold self._lock around every C call that uses the
    handle, so the object may be shared between threads and close() waits for a call
    in flight;
  * self._live() (under the lock) returns the handle, or raises PockError naming the
    object (with .status = pock.h's POCK_ERR_CLOSED) once it is closed;
  * close() frees it once (closing twice is fine), the with-statement closes it, and
    __del__ closes it quietly (also when __init__ failed before the handle was open).

bind() attaches a table of C signatures {name: (restype, argtypes)} to a loaded library;
check() raises the library's last error for a non-zero pock_status.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Callable, Mapping

from ..errors import PockError

ERR_CLOSED = 7  # pock.h: POCK_ERR_CLOSED


def bind(lib: ctypes.CDLL, signatures: Mapping[str, tuple], missing: Callable[[str], Exception] | None = None,
         optional: bool = False) -> ctypes.CDLL:
    """Set restype/argtypes of every function named in signatures ({name: (restype, argtypes)}).
    A function lib lacks raises missing(name) (AttributeError when missing is None), or is
    left unbound when optional."""
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name, None)
        if fn is None:
            if optional:
                continue
            if missing is not None:
                raise missing(name)
            getattr(lib, name)  # AttributeError naming the symbol
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def check(lib: ctypes.CDLL, status: int) -> None:
    """PockError with lib's pock_last_error() (and .status) unless status is 0 (POCK_OK)."""
    if status != 0:
        err = PockError(lib.pock_last_error().decode("utf-8", "replace"))
        err.status = status
        raise err


class NativeHandle:
    """Base of the ctypes handle classes: see the module docstring."""

    _closed_message = "the handle is closed"  # the PockError of a call after close(), naming the object
    _handle = None  # class defaults: close()/__del__ work even if __init__ failed before opening
    _lock = None

    def __init__(self):
        self._handle = None
        self._lock = threading.RLock()

    def _release(self, handle) -> None:
        """Free the C object (called once, under the lock, after self._handle is cleared)."""
        raise NotImplementedError

    def _live(self):
        if self._handle is None:
            err = PockError(self._closed_message)
            err.status = ERR_CLOSED
            raise err
        return self._handle

    @property
    def closed(self) -> bool:
        return self._handle is None

    def close(self) -> None:
        """Free the object; later calls raise PockError.  Closing twice is fine."""
        if self._lock is None:
            return  # __init__ never got as far as the lock: nothing was opened
        with self._lock:
            handle, self._handle = self._handle, None
            if handle is not None:
                self._release(handle)

    def __enter__(self):
        self._live()  # a closed object is an error here already, not at its first call
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
