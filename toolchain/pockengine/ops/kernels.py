"""The C kernels the op records call, and test shims derived from them.

A record's `cpu` builder writes the C++ call of its kernel(s) (`pk::linear_fwd(...)`); the
kernels' signatures are declared once, in native/runtime/include/pock_kernels.h.  From
those two this module derives:

  kernels_of(record)    the pk:: functions a record's CPU call names
  signatures()          {kernel: Signature} parsed from pock_kernels.h (a template: one per
                        explicit instance in the kernel sources, `strided_copy_float`)
  shim_source(names)    extern "C" `shim_<kernel>` wrappers, so ctypes (the kernel tests,
                        tests/native/runtime) calls a kernel with plain pointers and numbers
  argtypes(signature)   the ctypes argument types of its shim
  driver_source(names)  the aarch64 kernel test's dispatch (tests/arm64/kernel_check.cpp):
                        each kernel called with its arguments taken from a case by name

Pointers, integers, floats, bools and enums travel as they are (bools and enums as int).  A
parameter struct travels as its members, in order, in its place: a struct of scalars
(GemmParams, Conv2dParams) braced in place; one with fixed-size arrays (Broadcast, Reduce,
StridedCopy: each array as a pointer to its first `ndim` elements) or nested structs
(SdpaParams' SdpaLayout q: `q_sb, q_sh, q_sr`) built by a generated pack_<S>().  A kernel
whose shim is written by hand is left out of the generated file beside it (`beside`).
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
    """The pk:: functions (kernels and checks) record's CPU calls name (`cpu`, and `cpu_finite`,
    the exact guard's checking form); a `{suffix}` call (`pk::linear_fwd{suffix}`) is both the
    plain kernel and its `_act` form."""
    if record.cpu is None:
        return set()
    seen: set[int] = set()
    text = "\n".join(t for fn in (record.cpu, record.cpu_finite) if fn for t in _sources(fn, seen))
    text = text.replace("{n.op}", record.name)
    out: set[str] = set()
    for k in re.findall(r"pk::(\w+(?:\{suffix\})?)", text):
        out |= {k.replace("{suffix}", ""), k.replace("{suffix}", "_act")} if "{suffix}" in k else {k}
    return out


def record_kernels() -> dict[str, set[str]]:
    """{op: the pk:: names its record's CPU call uses} for every record."""
    return {name: kernels_of(r) for name, r in REGISTRY.items()}


@dataclass(frozen=True)
class Signature:
    """One function pock_kernels.h declares (or one explicit instance of a template it declares:
    name `strided_copy_float`, call `strided_copy<float>`)."""
    name: str
    ret: str  # "void", "i64", ...
    params: tuple[tuple[str, str], ...]  # (C type, name)
    call: str = ""  # the pk:: callee when it is not `name` (a template instance)
    template: str = ""  # the template's name (`strided_copy`) for an instance
    defaults: tuple = ()  # (name, default) of the parameters declared with one


@dataclass(frozen=True)
class Field:
    """One member of a parameter struct: `i64 shape[kMaxDims]`, `SdpaLayout q{}`, `i64 H = 1`."""
    ctype: str
    name: str
    extent: str | None = None  # an array member's length, as the C++ names it (`pk::kMaxDims`)
    default: str | None = None  # its default member initializer (`{}`: the type's own defaults)


@dataclass(frozen=True)
class Param:
    """One parameter of a shim (and of the driver's call): its C type, name, ctypes type and,
    when the header gives one, its default (which the driver uses when a case leaves it out)."""
    ctype: str
    name: str
    ct: object
    default: str | None = None


# C type -> (the shim's C type, how the shim passes it on, its ctypes type)
_PLAIN = {"i64": ("pk::i64", "{}", ctypes.c_int64), "int64_t": ("int64_t", "{}", ctypes.c_int64),
          "int": ("int", "{}", ctypes.c_int), "int32_t": ("int32_t", "{}", ctypes.c_int32),
          "uint64_t": ("uint64_t", "{}", ctypes.c_uint64), "float": ("float", "{}", ctypes.c_float),
          "double": ("double", "{}", ctypes.c_double), "bool": ("int", "{} != 0", ctypes.c_int),
          "uint8_t": ("uint8_t", "{}", ctypes.c_uint8), "int8_t": ("int8_t", "{}", ctypes.c_int8)}
_RET = {"void": None, "i64": ctypes.c_int64, "float": ctypes.c_float, "bool": ctypes.c_bool}
_DECL = re.compile(r"^(?:inline\s+)?(void|i64|float|bool)\s+(\w+)\s*\(([^;{]*?)\)\s*[;{]", re.M | re.S)
_TEMPLATE = re.compile(r"^template\s*<([^>]*)>\s*(void|i64|float|bool)\s+(\w+)\s*\(([^;{]*?)\)\s*;", re.M | re.S)
_INSTANCE = re.compile(r"^template\s+(?:void|i64|float|bool)\s+(\w+)\s*<([^>]*)>\s*\(", re.M)
_STRUCT = re.compile(r"\bstruct\s+(\w+)\s*\{((?:[^{}]|\{[^{}]*\})*)\};")
_FIELD = re.compile(r"^(\w+)\s*(?:\[(\w+)\])?\s*(?:=\s*(.+)|(\{[^{}]*\}))?$")


def _runtime_header() -> Path:
    from ..build.host import runtime_dir
    return runtime_dir() / HEADER


@dataclass(frozen=True)
class _Header:
    sigs: dict  # {name: Signature}
    enums: frozenset
    structs: dict  # {struct: (Field, ...)}, every struct the header defines


def _params(text: str) -> tuple[list, list]:
    """[(C type, name)] and [(name, default)] of a declaration's parameter list."""
    ps, defaults = [], []
    for p in filter(None, (p.strip() for p in text.split(","))):
        decl, eq, default = p.partition("=")
        ctype, _, pname = " ".join(decl.split()).rpartition(" ")
        if pname.startswith("*"):
            ctype, pname = ctype + "*", pname[1:]
        ps.append((ctype, pname))
        if eq:
            defaults.append((pname, default.strip()))
    return ps, defaults


def _parse(text: str, instances: str = "") -> _Header:
    """The signatures, enum names and structs of a header's text; `instances` (the kernel
    sources' text) names the explicit instances of its templates, each a signature of its own.
    Overloaded names are left out (no plain C wrapper can name both)."""
    enums = frozenset(re.findall(r"\benum class\s+(\w+)", text))
    text = re.sub(r"//[^\n]*", "", text)
    consts = {k: int(v) for k, v in re.findall(r"\bconstexpr\s+int\s+(\w+)\s*=\s*(\d+)\s*;", text)}
    structs = {}
    for name, body in _STRUCT.findall(text):
        fields = []
        for decl in filter(None, (" ".join(d.split()) for d in body.split(";"))):
            ctype, _, names = decl.partition(" ")
            for f in re.split(r",\s*(?![^{]*\})", names):
                m = _FIELD.match(f.strip())
                if m is None:
                    fields = None
                    break
                fname, extent, default, brace = m.groups()
                if extent is not None and not extent.isdigit():
                    extent = f"pk::{extent}" if extent in consts else None  # kMaxDims
                    if extent is None:
                        fields = None
                        break
                fields.append(Field(ctype, fname, extent, default.strip() if default else brace))
            if fields is None:
                break
        if fields is not None:
            structs[name] = tuple(fields)
    out: dict[str, Signature | None] = {}
    for ret, name, params in _DECL.findall(text):
        ps, defaults = _params(params)
        out[name] = None if name in out else Signature(name, ret, tuple(ps), defaults=tuple(defaults))
    templates = {name: (ret, [t.split()[-1] for t in tparams.split(",")], params)
                 for tparams, ret, name, params in _TEMPLATE.findall(text)}
    for name, targs in _INSTANCE.findall(re.sub(r"//[^\n]*", "", instances)):
        if name not in templates:
            continue
        ret, tnames, params = templates[name]
        types = [t.strip() for t in targs.split(",")]
        if len(types) != len(tnames) or not all(t in _POINTEES for t in types):  # a macro's (S, D)
            continue
        for t, actual in zip(tnames, types):
            params = re.sub(rf"\b{t}\b", actual, params)
        ps, defaults = _params(params)
        inst = f"{name}_{'_'.join(types)}"
        out[inst] = Signature(inst, ret, tuple(ps), f"{name}<{', '.join(types)}>", name, tuple(defaults))
    return _Header({k: v for k, v in out.items() if v is not None}, enums, structs)


def _header(header: Path | None = None) -> _Header:
    """The parsed header and, beside it (../kernels/*.cpp), its templates' explicit instances;
    parsed again only when one of those files changes."""
    path = Path(header or _runtime_header())
    files = [path, *sorted((path.parent.parent / "kernels").glob("*.cpp"))]
    return _header_of(tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in files))


@functools.lru_cache(maxsize=8)
def _header_of(files: tuple) -> _Header:
    (path, _, _), *kernels = files
    return _parse(Path(path).read_text(), "".join(Path(k).read_text() for k, _, _ in kernels))


def signatures(header: Path | None = None) -> dict[str, Signature]:
    """{kernel name: Signature} of the functions pock_kernels.h declares, and of each explicit
    instance (`strided_copy_float`) the kernel sources give of a template it declares."""
    return dict(_header(header).sigs)


def _flat(struct: str, h: _Header) -> bool:
    """Whether a struct is scalar fields only (brace-initialised in place: pk::GemmParams{...})."""
    return all(f.ctype in _PLAIN and f.extent is None for f in h.structs[struct])


@dataclass(frozen=True)
class _Leaf:
    """One scalar or array member of a struct, as a shim parameter."""
    param: Param
    path: str  # the C++ member path (`q.sb`)
    ctype: str  # its declared type (`bool`)
    extent: str | None = None  # an array's length
    count: str | None = None  # how many of its elements the pointer gives (`ndim`)


def _leaves(struct: str, h: _Header, name: str = "", path: str = "", seen=()):
    """[_Leaf] of a struct's members: a nested struct's as `<member>_<field>` (its defaults
    its own), an array as a pointer to its first elements (`bool` ones as uint8_t), filled for
    the struct's `ndim` entries when it has an `ndim` member, else its extent; None when a
    member is of no type a shim can pass."""
    if struct in seen:
        return None
    fields = h.structs[struct]
    has_ndim = any(f.name == "ndim" and f.extent is None for f in fields)
    out = []
    for f in fields:
        if f.ctype in h.structs and f.extent is None:
            sub = _leaves(f.ctype, h, f"{name}{f.name}_", f"{path}{f.name}.", (*seen, struct))
            if sub is None:
                return None
            out += sub
        elif f.ctype in _PLAIN:
            shim_t, _, ct = _PLAIN[f.ctype]
            if f.extent is None:
                default = None if f.default in (None, "{}") else f.default
                out.append(_Leaf(Param(shim_t, name + f.name, ct, default), path + f.name, f.ctype))
            else:
                elem = "uint8_t" if f.ctype == "bool" else shim_t
                out.append(_Leaf(Param(f"const {elem}*", name + f.name, ctypes.c_void_p), path + f.name, f.ctype,
                                 f.extent, "ndim" if has_ndim else f.extent))
        else:
            return None
    return out


def _packer(struct: str, h: _Header) -> str:
    """A C++ function `pack_<struct>(its leaves)` that builds the struct (see _leaves)."""
    leaves = _leaves(struct, h)
    body = [f"pk::{struct} pack_{struct}({', '.join(f'{x.param.ctype} {x.param.name}' for x in leaves)}) {{",
            f"  pk::{struct} s_{{}};"]
    for x in leaves:
        p, conv = x.param.name, " != 0" if x.ctype == "bool" else ""
        if x.extent is None:
            body.append(f"  s_.{x.path} = {p}{conv};")
        else:
            body.append(f"  for (int d = 0; {p} && d < {x.count} && d < {x.extent}; ++d) s_.{x.path}[d] = {p}[d]{conv};")
    return "\n".join(body + ["  return s_;", "}"])


def _expand(sig: Signature, header: Path | None = None):
    """([Param] per shim parameter, the call's arguments, the structs it packs), or None when a
    parameter is not plain.  A `const S&` becomes its members (named `<param>_<field>` where
    a member shares another parameter's name): a struct of scalar fields braced in place, any
    other (arrays, nested structs) through its pack_<S>() (_packer)."""
    h = _header(header)
    taken = {p for _, p in sig.params}
    defaults = dict(sig.defaults)
    params, args, packs = [], [], []
    for ctype, pname in sig.params:
        struct = re.fullmatch(r"const (\w+)&", ctype)
        if struct and struct.group(1) in h.structs:
            s = struct.group(1)
            leaves = _leaves(s, h)
            if leaves is None:
                return None
            flat = all(x.extent is None and "." not in x.path for x in leaves)
            parts = []
            for x in leaves:
                name = f"{pname}_{x.param.name}" if x.param.name in taken else x.param.name
                params.append(Param(x.param.ctype, name, x.param.ct, x.param.default))
                parts.append(_PLAIN[x.ctype][1].format(name) if flat else name)
            args.append(f"pk::{s}{{{', '.join(parts)}}}" if flat else f"pack_{s}({', '.join(parts)})")
            packs += [] if flat else [s]
            continue
        plain_param = _param(ctype, h.enums)
        if plain_param is None:
            return None
        shim_t, fmt, ct = plain_param
        params.append(Param(shim_t, pname, ct, defaults.get(pname)))
        args.append(fmt.format(pname))
    return params, args, packs


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
    return None  # a struct the header does not define


def plain(sig: Signature, header: Path | None = None) -> bool:
    """Whether a C function of plain parameters can call sig: each is a pointer, a number,
    a bool or an enum (as int), or a struct made of those, of fixed-size arrays of those
    (each as a pointer) and of such structs (their members in its place, see _leaves)."""
    return sig.ret in _RET and _expand(sig, header) is not None


def _packers(names, header) -> list[str]:
    """The pack_<S>() functions the calls of `names` need, each once, in an anonymous namespace."""
    sigs, h = signatures(header), _header(header)
    need = sorted({s for n in names for s in _expand(sigs[n], header)[2]})
    return ["namespace {", *(_packer(s, h) for s in need), "}  // namespace", ""] if need else []


def shim_source(names, header: Path | None = None) -> str:
    """A C++ file of extern "C" `shim_<name>` wrappers over the pk:: kernels `names` (each
    must be plain, see plain())."""
    sigs = signatures(header)
    lines = ["// Generated by pockengine.ops.kernels from the op records and pock_kernels.h. Do not edit.",
             '#include "pock_kernels.h"', "", *_packers(names, header), 'extern "C" {']
    for name in sorted(names):
        sig = sigs[name]
        params, call_args, _ = _expand(sig, header)
        args = ", ".join(f"{p.ctype} {p.name}" for p in params)
        call = ", ".join(call_args)
        ret = "pk::i64" if sig.ret == "i64" else sig.ret
        callee = sig.call or name
        body = f"pk::{callee}({call});" if sig.ret == "void" else f"return pk::{callee}({call});"
        lines.append(f"{ret} shim_{name}({args}) {{ {body} }}")
    lines.append('}  // extern "C"')
    return "\n".join(lines) + "\n"


def argtypes(sig: Signature, header: Path | None = None) -> tuple[list, object]:
    """(ctypes argtypes, restype) of sig's shim."""
    return [p.ct for p in _expand(sig, header)[0]], _RET[sig.ret]


def hand_written(paths) -> set[str]:
    """The kernels the hand-written shim files `paths` wrap (their `shim_<kernel>` names)."""
    return {k for p in paths for k in re.findall(r"\bshim_(\w+)\s*\(", Path(p).read_text())}


def record_shim_kernels(header: Path | None = None, beside=()) -> list[str]:
    """The kernels the op records call whose shims are generated (plain signatures), sorted;
    those the hand-written shim files `beside` wrap are left out."""
    hand = hand_written(beside)
    return sorted(k for k, sig in _record_sigs(header).items() if k not in hand and plain(sig, header))


def _record_sigs(header: Path | None = None) -> dict[str, Signature]:
    """The signatures of the kernels the op records call (a template's: each of its instances)."""
    named = set().union(*record_kernels().values())
    return {k: sig for k, sig in signatures(header).items() if (sig.template or k) in named}


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
    arg_int/arg_num a scalar (one declared with a default is that default when arg_has says
    the case leaves it out), arg_ret the kernel's return value.  A struct parameter's members
    and enums travel as shim_source() passes them (an array member: a buffer of its name).  The arm64 kernel test's driver
    (tests/arm64/kernel_check.cpp) links it."""
    sigs = signatures(header)
    lines = ["// Generated by pockengine.ops.kernels from pock_kernels.h. Do not edit.", "#include <cstring>",
             '#include "pock_kernels.h"', "", "struct Args;",
             "void* arg_ptr(Args& a, const char* name, const char* type, bool writable);",
             "long long arg_int(Args& a, const char* name);", "double arg_num(Args& a, const char* name);",
             "bool arg_has(Args& a, const char* name);", "void arg_ret(Args& a, double value);", "",
             *_packers(names, header), "namespace {"]
    table = []
    for name in sorted(names):
        sig = sigs[name]
        params, call_args, _ = _expand(sig, header)
        body = []
        for x in params:
            shim_t, p = x.ctype, x.name
            if shim_t.endswith("*"):
                writable, tag = _pointer(shim_t)
                body.append(f'  auto {p} = static_cast<{shim_t}>(arg_ptr(args_, "{p}", "{tag}", {str(writable).lower()}));')
                continue
            value = f'static_cast<{shim_t}>({"arg_num" if shim_t in ("float", "double") else "arg_int"}(args_, "{p}"))'
            if x.default is not None:
                value = f'arg_has(args_, "{p}") ? {value} : static_cast<{shim_t}>({x.default})'
            body.append(f"  {shim_t} {p} = {value};")
        call = f"pk::{sig.call or name}({', '.join(call_args)})"
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
    return sorted(k for k, sig in _record_sigs(header).items() if driveable(sig, header))
