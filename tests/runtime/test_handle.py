"""runtime/handle.py: NativeHandle's lifetime rules (use after close, double close, with,
__del__, threads) over a real C allocation (libc malloc/free) and over pe.Tokenizer; bind()
and check() (over libc and the tokenizer library)."""
import ctypes
import ctypes.util
import threading

import pytest

import pockengine as pe
from pockengine.runtime.handle import ERR_CLOSED, NativeHandle, bind, check

_libc = ctypes.CDLL(ctypes.util.find_library("c"))
_libc.malloc.restype, _libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
_libc.free.restype, _libc.free.argtypes = None, [ctypes.c_void_p]


class Block(NativeHandle):
    """8 bytes of C memory holding a counter; counts how often it was freed."""

    _closed_message = "the block is closed"

    def __init__(self):
        super().__init__()
        self.frees = 0
        self._handle = _libc.malloc(8)
        ctypes.c_int64.from_address(self._handle).value = 0

    def bump(self) -> int:
        with self._lock:
            cell = ctypes.c_int64.from_address(self._live())
            cell.value += 1
            return cell.value

    def _release(self, handle) -> None:
        self.frees += 1
        _libc.free(handle)


def test_use_after_close_names_the_object():
    b = Block()
    assert b.bump() == 1 and not b.closed
    b.close()
    assert b.closed
    with pytest.raises(pe.PockError, match="the block is closed") as e:
        b.bump()
    assert e.value.status == ERR_CLOSED


def test_double_close_frees_once():
    b = Block()
    b.close()
    b.close()
    assert b.frees == 1


def test_with_closes_and_refuses_a_closed_object():
    with Block() as b:
        assert b.bump() == 1
    assert b.closed and b.frees == 1
    with pytest.raises(pe.PockError, match="the block is closed"):
        with b:
            pass


def test_del_after_close_is_harmless():
    b = Block()
    b.close()
    b.__del__()
    b.__del__()
    assert b.frees == 1
    del b


def test_del_frees_an_open_object_once():
    b = Block()
    b.__del__()
    assert b.closed and b.frees == 1
    b.close()
    assert b.frees == 1


def test_del_after_a_failed_init_is_harmless():
    class Early(Block):
        def __init__(self):
            raise pe.PockError("failed before the base __init__")

    with pytest.raises(pe.PockError, match="failed before"):
        Early()
    e = Early.__new__(Early)  # what __del__ sees after that __init__ raised
    e.__del__()
    e.close()
    assert e.closed


def test_concurrent_close_and_use():
    """Threads use a block while another closes it: each call either runs on live memory
    or raises the closed error; the memory is freed exactly once."""
    for _ in range(20):
        b = Block()
        errors, done = [], []
        start = threading.Barrier(5)

        def use():
            start.wait()
            n = 0
            try:
                for _ in range(2000):
                    b.bump()
                    n += 1
            except pe.PockError as e:
                if "the block is closed" not in str(e):
                    errors.append(e)
            except Exception as e:  # anything else is a bug
                errors.append(e)
            done.append(n)

        def close():
            start.wait()
            b.close()
            b.close()

        threads = [threading.Thread(target=use) for _ in range(4)] + [threading.Thread(target=close)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors and len(done) == 4 and b.frees == 1


def test_tokenizer_concurrent_close_and_use(tmp_path):
    from tokenizers import Tokenizer as HF, models, pre_tokenizers, trainers
    hf = HF(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.train_from_iterator(["hello world, the handle is closed"] * 20,
                           trainers.BpeTrainer(vocab_size=300, show_progress=False,
                                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    data = hf.to_str().encode()
    for _ in range(5):
        tok = pe.Tokenizer.from_bytes(data)
        want = tok.encode("hello world")
        errors, start = [], threading.Barrier(4)

        def use():
            start.wait()
            try:
                for _ in range(500):
                    assert tok.encode("hello world") == want
                    assert tok.decode(want) == "hello world"
            except pe.PockError as e:
                if "the tokenizer is closed" not in str(e):
                    errors.append(e)
            except Exception as e:
                errors.append(e)

        threads = [threading.Thread(target=use) for _ in range(3)]
        for t in threads:
            t.start()
        start.wait()
        tok.close()
        for t in threads:
            t.join()
        assert not errors and tok.closed
        with pytest.raises(pe.PockError, match="the tokenizer is closed"):
            tok.encode("x")


def test_bind_and_check():
    sigs = {"strlen": (ctypes.c_size_t, [ctypes.c_char_p])}
    lib = bind(ctypes.CDLL(ctypes.util.find_library("c")), sigs)
    assert lib.strlen(b"four") == 4 and lib.strlen.argtypes == [ctypes.c_char_p]
    with pytest.raises(AttributeError, match="pock_no_such_fn"):
        bind(lib, {"pock_no_such_fn": (None, [])})
    with pytest.raises(pe.PockError, match="no pock_no_such_fn"):
        bind(lib, {"pock_no_such_fn": (None, [])}, missing=lambda name: pe.PockError(f"no {name}"))
    bind(lib, {"pock_no_such_fn": (None, [])}, optional=True)

    from pockengine.runtime.tokenizer import _lib
    tok_lib, h = _lib(), ctypes.c_void_p()
    check(tok_lib, 0)
    status = tok_lib.pock_tokenizer_open_memory(b"{not json", 9, ctypes.byref(h))
    assert status != 0
    with pytest.raises(pe.PockError) as e:
        check(tok_lib, status)
    assert e.value.status == status and str(e.value)
