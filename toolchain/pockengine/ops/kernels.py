"""The C kernels the op records call, and test shims derived from them.

A record's `cpu` builder writes the C++ call of its kernel(s) (`pk::linear_fwd(...)`); the
kernels' signatures are declared once, in codegen/runtime/include/pock_kernels.h.  From
those two this module derives:

  kernels_of(record)    the pk:: functions a record's CPU call names
  signatures()          {kernel: Signature} parsed from pock_kernels.h
  shim_source(names)    extern "C" `shim_<kernel>` wrappers, so ctypes (the kernel tests,
                        tests/codegen/runtime) calls a kernel with plain pointers and numbers
  argtypes(signature)   the ctypes argument types of its shim

A kernel whose parameters are plain (pointers, integers, floats, bools, enums) gets a
generated shim: bools and enums travel as int, and a parameter struct of plain fields
(GemmParams, LstmParams) travels as its fields, in order, in its place.  A kernel whose shim
is written by hand (tests/codegen/runtime/shims: Conv2dParams packed from an array, a struct
with array fields, composites) is left out of the generated file beside it (`beside`).
"""
from __future__ import annotations

import ctypes
import functools
import inspect
import re
import types
from dataclasses import dataclass
from pathlib import Path

from .record import REGISTRY, OpRecord

HEADER = "include/pock_kernels.h"  # under the runtime directory (build.host.runtime_dir())


def _sources(fn, seen) -> list[str]:
    """The source of fn and of the ops-package functions it calls or builds on (closures)."""
    if id(fn) in seen or not isinstance(fn, types.FunctionType) or not fn.__module__.startswith("pockengine.ops"):
        return []
    seen.add(id(fn))
    text = inspect.getsource(fn)
    for var, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):  # pk::{op}_fwd made by a factory
        if isinstance(cell.cell_contents, str):
            text = text.replace("{" + var + "}", cell.cell_contents)
    out = [text]
    codes = [fn.__code__]
    while codes:
        code = codes.pop()
        codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
        out += [c for c in code.co_consts if isinstance(c, str)]  # f-string pieces (a lambda's source may be cut)
        for name in code.co_names:
            out += _sources(fn.__globals__.get(name), seen)
    return out


def kernels_of(record: OpRecord) -> set[str]:
    """The pk:: functions (kernels and checks) record's CPU call names; a `{suffix}` call
    (`pk::linear_fwd{suffix}`) is both the plain kernel and its `_act` form."""
    if record.cpu is None:
        return set()
    text = "\n".join(_sources(record.cpu, set())).replace("{n.op}", record.name)
    out: set[str] = set()
    for k in re.findall(r"pk::(\w+(?:\{suffix\})?)", text):
        out |= {k.replace("{suffix}", ""), k.replace("{suffix}", "_act")} if "{suffix}" in k else {k}
    return out


def record_kernels() -> dict[str, set[str]]:
    """{op: the pk:: names its record's CPU call uses} for every record."""
    return {name: kernels_of(r) for name, r in REGISTRY.items()}


@dataclass(frozen=True)
class Signature:
    """One function pock_kernels.h declares."""
    name: str
    ret: str  # "void", "i64", ...
    params: tuple[tuple[str, str], ...]  # (C type, name)


# C type -> (the shim's C type, how the shim passes it on, its ctypes type)
_PLAIN = {"i64": ("pk::i64", "{}", ctypes.c_int64), "int64_t": ("int64_t", "{}", ctypes.c_int64),
          "int": ("int", "{}", ctypes.c_int), "int32_t": ("int32_t", "{}", ctypes.c_int32),
          "uint64_t": ("uint64_t", "{}", ctypes.c_uint64), "float": ("float", "{}", ctypes.c_float),
          "double": ("double", "{}", ctypes.c_double), "bool": ("int", "{} != 0", ctypes.c_int)}
_RET = {"void": None, "i64": ctypes.c_int64, "float": ctypes.c_float, "bool": ctypes.c_bool}
_DECL = re.compile(r"^(?:inline\s+)?(void|i64|float|bool)\s+(\w+)\s*\(([^;{]*?)\)\s*[;{]", re.M | re.S)


def _runtime_header() -> Path:
    from ..build.host import runtime_dir
    return runtime_dir() / HEADER


@functools.lru_cache(maxsize=None)
def _parse(text: str) -> tuple[dict[str, Signature], frozenset, dict]:
    """(signatures, enum names, {struct: ((C type, field), ...)} of the structs of scalar
    fields) of a header's text; overloaded names are left out (no plain C wrapper can name
    both)."""
    enums = frozenset(re.findall(r"\benum class\s+(\w+)", text))
    text = re.sub(r"//[^\n]*", "", text)
    structs = {}
    for name, body in re.findall(r"\bstruct\s+(\w+)\s*\{([^}]*)\};", text):
        fields = []
        for decl in filter(None, (d.strip() for d in body.split(";"))):
            ctype, _, names = decl.partition(" ")
            fields += [(ctype, f.strip()) for f in names.split(",")]
        if all(t in _PLAIN and re.fullmatch(r"\w+", f) for t, f in fields):
            structs[name] = tuple(fields)
    out: dict[str, Signature | None] = {}
    for ret, name, params in _DECL.findall(text):
        ps = []
        for p in filter(None, (p.partition("=")[0].strip() for p in params.split(","))):  # no defaults
            ctype, _, pname = " ".join(p.split()).rpartition(" ")
            if pname.startswith("*"):
                ctype, pname = ctype + "*", pname[1:]
            ps.append((ctype, pname))
        out[name] = None if name in out else Signature(name, ret, tuple(ps))
    return {k: v for k, v in out.items() if v is not None}, enums, structs


def signatures(header: Path | None = None) -> dict[str, Signature]:
    """{kernel name: Signature} of the non-template functions pock_kernels.h declares."""
    return dict(_parse(Path(header or _runtime_header()).read_text())[0])


def _enums(header: Path | None = None) -> frozenset:
    return _parse(Path(header or _runtime_header()).read_text())[1]


def _structs(header: Path | None = None) -> dict:
    return _parse(Path(header or _runtime_header()).read_text())[2]


def _expand(sig: Signature, header: Path | None = None):
    """[(shim C type, shim name, ctypes type)] per shim parameter and the call's arguments,
    or None when a parameter is not plain.  A `const S&` of a struct of scalar fields becomes
    its fields (named `<param>_<field>` where a field shares another parameter's name)."""
    enums, structs = _enums(header), _structs(header)
    taken = {p for _, p in sig.params}
    params, args = [], []
    for ctype, pname in sig.params:
        struct = re.fullmatch(r"const (\w+)&", ctype)
        if struct and struct.group(1) in structs:
            parts = []
            for ftype, field in structs[struct.group(1)]:
                shim_t, fmt, ct = _PLAIN[ftype]
                name = f"{pname}_{field}" if field in taken else field
                params.append((shim_t, name, ct))
                parts.append(fmt.format(name))
            args.append(f"pk::{struct.group(1)}{{{', '.join(parts)}}}")
            continue
        plain_param = _param(ctype, enums)
        if plain_param is None:
            return None
        shim_t, fmt, ct = plain_param
        params.append((shim_t, pname, ct))
        args.append(fmt.format(pname))
    return params, args


_POINTEES = {"float", "double", "void", "i64", "int64_t", "int32_t", "int", "uint8_t", "int8_t", "uint16_t",
             "uint32_t", "uint64_t"}


def _param(ctype: str, enums):
    """(shim C type, pass-on format, ctypes type) of a plain parameter, or None."""
    if ctype.endswith("*"):
        if ctype.replace("const ", "").rstrip("*").strip() not in _POINTEES:
            return None
        return re.sub(r"\bi64\b", "pk::i64", ctype), "{}", ctypes.c_void_p
    if ctype in _PLAIN:
        return _PLAIN[ctype]
    if ctype in enums:
        return "int", f"static_cast<pk::{ctype}>({{}})", ctypes.c_int
    return None  # a parameter struct (const Conv2dParams&): a hand-written shim packs it


def plain(sig: Signature, header: Path | None = None) -> bool:
    """Whether every parameter of sig passes through a C function unchanged (or as int, or a
    struct of scalars as its fields)."""
    return sig.ret in _RET and _expand(sig, header) is not None


def shim_source(names, header: Path | None = None) -> str:
    """A C++ file of extern "C" `shim_<name>` wrappers over the pk:: kernels `names` (each
    must be plain, see plain())."""
    sigs = signatures(header)
    lines = ["// Generated by pockengine.ops.kernels from the op records and pock_kernels.h. Do not edit.",
             '#include "pock_kernels.h"', "", 'extern "C" {']
    for name in sorted(names):
        sig = sigs[name]
        params, call_args = _expand(sig, header)
        args = ", ".join(f"{shim_t} {p}" for shim_t, p, _ in params)
        call = ", ".join(call_args)
        ret = "pk::i64" if sig.ret == "i64" else sig.ret
        body = f"pk::{name}({call});" if sig.ret == "void" else f"return pk::{name}({call});"
        lines.append(f"{ret} shim_{name}({args}) {{ {body} }}")
    lines.append('}  // extern "C"')
    return "\n".join(lines) + "\n"


def argtypes(sig: Signature, header: Path | None = None) -> tuple[list, object]:
    """(ctypes argtypes, restype) of sig's shim."""
    return [ct for _, _, ct in _expand(sig, header)[0]], _RET[sig.ret]


def hand_written(paths) -> set[str]:
    """The kernels the hand-written shim files `paths` wrap (their `shim_<kernel>` names)."""
    return {k for p in paths for k in re.findall(r"\bshim_(\w+)\s*\(", Path(p).read_text())}


def record_shim_kernels(header: Path | None = None, beside=()) -> list[str]:
    """The kernels the op records call whose shims are generated (plain signatures), sorted;
    those the hand-written shim files `beside` wrap are left out."""
    sigs = signatures(header)
    named = set().union(*record_kernels().values()) - hand_written(beside)
    return sorted(k for k in named if k in sigs and plain(sigs[k], header))


def write_record_shims(out_dir: Path | None = None, beside=()) -> Path:
    """shim_source(record_shim_kernels(beside=beside)) written to out_dir (default the cache's
    shims/), named by its content; the kernel tests compile it beside their hand-written
    shims `beside`."""
    import hashlib

    from ..build.host import cache_dir, write_source
    text = shim_source(record_shim_kernels(beside=beside))
    out_dir = Path(out_dir) if out_dir is not None else cache_dir() / "shims"
    return write_source(out_dir / f"record_shims-{hashlib.sha256(text.encode()).hexdigest()[:16]}.cpp", text)


def _pointer(ctype: str) -> tuple[bool, str]:
    """(writable, element type tag) of a pointer parameter's shim type."""
    return not ctype.startswith("const"), ctype.replace("const ", "").rstrip("*").strip().replace("pk::", "")


def driveable(sig: Signature, header: Path | None = None) -> bool:
    """Whether a case-file driver can call sig (every plain kernel can)."""
    return plain(sig, header)


def driver_source(names, header: Path | None = None) -> str:
    """A C++ file defining `bool pock_call(const char* kernel, Args& a)`: calls the pk::
    kernel `kernel` (one of `names`, each driveable()) with its arguments taken by parameter
    name from a, through the functions (declared here) a driver defines over its Args:
    arg_ptr(a, name, element type, writable) a buffer (nullptr when a has none; a `void*`
    one's element type is the case's to say),
    arg_int/arg_num a scalar, arg_ret the kernel's return value.  A struct parameter's fields
    and enums travel as shim_source() passes them.  The arm64 kernel test's driver
    (tests/arm64/kernel_check.cpp) links it."""
    sigs = signatures(header)
    lines = ["// Generated by pockengine.ops.kernels from pock_kernels.h. Do not edit.", "#include <cstring>",
             '#include "pock_kernels.h"', "", "struct Args;",
             "void* arg_ptr(Args& a, const char* name, const char* type, bool writable);",
             "long long arg_int(Args& a, const char* name);", "double arg_num(Args& a, const char* name);",
             "void arg_ret(Args& a, double value);", "", "namespace {"]
    table = []
    for name in sorted(names):
        sig = sigs[name]
        params, call_args = _expand(sig, header)
        body = []
        for shim_t, p, _ in params:
            if shim_t.endswith("*"):
                writable, tag = _pointer(shim_t)
                body.append(f'  auto {p} = static_cast<{shim_t}>(arg_ptr(args_, "{p}", "{tag}", {str(writable).lower()}));')
            elif shim_t in ("float", "double"):
                body.append(f'  {shim_t} {p} = static_cast<{shim_t}>(arg_num(args_, "{p}"));')
            else:
                body.append(f'  {shim_t} {p} = static_cast<{shim_t}>(arg_int(args_, "{p}"));')
        call = f"pk::{name}({', '.join(call_args)})"
        body.append(f"  {call};" if sig.ret == "void" else f"  arg_ret(args_, static_cast<double>({call}));")
        lines += [f"void call_{name}(Args& args_) {{", *body, "}"]
        table.append(f'    {{"{name}", call_{name}}},')
    lines += ["struct Entry { const char* name; void (*call)(Args&); };", "const Entry kCalls[] = {", *table,
              "    {nullptr, nullptr}};", "}  // namespace", "",
              "bool pock_call(const char* kernel, Args& a) {",
              "  for (const Entry* e = kCalls; e->name; ++e)",
              "    if (std::strcmp(e->name, kernel) == 0) return e->call(a), true;",
              "  return false;", "}"]
    return "\n".join(lines) + "\n"


def driver_kernels(header: Path | None = None) -> list[str]:
    """The kernels the op records call that a case-file driver can call (driveable), sorted."""
    sigs = signatures(header)
    named = set().union(*record_kernels().values())
    return sorted(k for k in named if k in sigs and driveable(sigs[k], header))
