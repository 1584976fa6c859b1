"""Just enough of Apple's binary formats to assemble and check an XCFramework
without Apple's tools: `ar` archives (BSD/Darwin flavour), universal ("fat")
files, and a Mach-O object's CPU, build version and symbol table.

    slices = [(CPU_ARM64, arm64_archive_bytes), (CPU_X86_64, x86_archive_bytes)]
    write_fat(path, slices)              # what `lipo -create` does
    for cpu, blob in read_fat(path.read_bytes()):
        for name, obj in read_archive(blob):
            info = read_macho(obj)       # MachO(cpu, platform, minos, exported)

Layouts (all from <mach-o/fat.h>, <mach-o/loader.h>, <mach-o/nlist.h>, <ar.h>):
  fat:      big-endian FAT_MAGIC, nfat_arch, then per slice {cputype,
            cpusubtype, offset, size, align (log2)}; each slice starts at a
            multiple of 2**align.
  ar:       "!<arch>\\n", then 60-byte member headers; a BSD name "#1/N" means
            the first N bytes of the member data are its name.
  Mach-O:   mach_header_64, then load commands; LC_BUILD_VERSION holds the
            platform and minimum OS (xxxx.yy.zz nibbles), LC_SYMTAB the nlist_64
            table and string table.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from ..errors import PockError

FAT_MAGIC = 0xCAFEBABE
MH_MAGIC_64 = 0xFEEDFACF
CPU_ARM64 = 0x0100000C
CPU_X86_64 = 0x01000007
CPU_NAMES = {CPU_ARM64: "arm64", CPU_X86_64: "x86_64"}
_CPU_SUBTYPE_ALL = {CPU_ARM64: 0, CPU_X86_64: 3}
FAT_ALIGN = 14  # slices start on 16 KiB pages, as lipo does for arm64

LC_SYMTAB = 0x2
LC_BUILD_VERSION = 0x32
PLATFORMS = {1: "macos", 2: "ios", 7: "ios-simulator"}
N_EXT, N_PEXT, N_TYPE, N_SECT = 0x01, 0x10, 0x0E, 0x0E

AR_MAGIC = b"!<arch>\n"


@dataclass
class MachO:
    cpu: str                 # "arm64" | "x86_64"
    platform: str | None     # "ios" | "ios-simulator" | ... (None: no LC_BUILD_VERSION)
    minos: tuple[int, int, int] | None
    exported: set[str]       # global, default-visibility symbols defined here, without the leading "_"


def read_archive(blob: bytes) -> list[tuple[str, bytes]]:
    """The members of an ar archive as (name, data), symbol tables left out."""
    if not blob.startswith(AR_MAGIC):
        raise PockError("not an ar archive (bad magic)")
    members, pos = [], len(AR_MAGIC)
    while pos + 60 <= len(blob):
        header = blob[pos:pos + 60]
        if header[58:60] != b"`\n":
            raise PockError(f"corrupt ar archive: bad member header at offset {pos}")
        name, size = header[:16].decode().strip(), int(header[48:58].decode().strip())
        data = blob[pos + 60:pos + 60 + size]
        if name.startswith("#1/"):  # BSD long name: stored at the start of the data
            n = int(name[3:])
            name, data = data[:n].rstrip(b"\0").decode(), data[n:]
        elif name.endswith("/") and name not in ("/", "//"):  # GNU short name
            name = name[:-1]
        if not name.startswith("__.SYMDEF") and name not in ("/", "//"):
            members.append((name, data))
        pos += 60 + size + (size & 1)
    return members


def archive_cpu(blob: bytes) -> int:
    """The Mach-O CPU type of an archive's first object."""
    for name, data in read_archive(blob):
        magic, cpu = struct.unpack_from("<Ii", data)
        if magic == MH_MAGIC_64:
            return cpu & 0xFFFFFFFF
    raise PockError("archive holds no 64-bit Mach-O object")


def write_fat(path: Path, slices: list[tuple[int, bytes]]) -> Path:
    """Write a universal file of thin slices [(cputype, bytes)] to path."""
    if len({cpu for cpu, _ in slices}) != len(slices):
        raise PockError("a universal file holds at most one slice per CPU type")
    align = 1 << FAT_ALIGN
    header = struct.pack(">II", FAT_MAGIC, len(slices))
    offset, entries, body = align, [], b""
    for cpu, data in slices:
        entries.append(struct.pack(">iiIII", _signed(cpu), _CPU_SUBTYPE_ALL.get(cpu, 0), offset, len(data), FAT_ALIGN))
        padded = data + b"\0" * (-len(data) % align)
        body += padded
        offset += len(padded)
    head = header + b"".join(entries)
    Path(path).write_bytes(head + b"\0" * (align - len(head)) + body)
    return Path(path)


def read_fat(blob: bytes) -> list[tuple[int, bytes]]:
    """The slices [(cputype, bytes)] of a universal file; a thin file is one slice."""
    if len(blob) < 8 or struct.unpack_from(">I", blob)[0] != FAT_MAGIC:
        cpu = archive_cpu(blob) if blob.startswith(AR_MAGIC) else struct.unpack_from("<I", blob, 4)[0]
        return [(cpu, blob)]
    (n,) = struct.unpack_from(">I", blob, 4)
    out = []
    for i in range(n):
        cpu, _sub, offset, size, align = struct.unpack_from(">iiIII", blob, 8 + 20 * i)
        if offset % (1 << align) or offset + size > len(blob):
            raise PockError(f"corrupt universal file: slice {i} at {offset} (+{size}) with align 2^{align}")
        out.append((cpu & 0xFFFFFFFF, blob[offset:offset + size]))
    return out


def read_macho(blob: bytes) -> MachO:
    """CPU, build version and exported symbols of a 64-bit Mach-O file."""
    if len(blob) < 32 or struct.unpack_from("<I", blob)[0] != MH_MAGIC_64:
        raise PockError("not a 64-bit little-endian Mach-O file")
    _magic, cpu, _sub, _ftype, ncmds, _size, _flags, _res = struct.unpack_from("<IiiIIIII", blob)
    platform = minos = None
    exported: set[str] = set()
    pos = 32
    for _ in range(ncmds):
        cmd, cmdsize = struct.unpack_from("<II", blob, pos)
        if cmd == LC_BUILD_VERSION:
            plat, version = struct.unpack_from("<II", blob, pos + 8)
            platform = PLATFORMS.get(plat, f"platform-{plat}")
            minos = (version >> 16, (version >> 8) & 0xFF, version & 0xFF)
        elif cmd == LC_SYMTAB:
            symoff, nsyms, stroff, _strsize = struct.unpack_from("<IIII", blob, pos + 8)
            for i in range(nsyms):
                strx, ntype, _sect, _desc, _value = struct.unpack_from("<IBBHQ", blob, symoff + 16 * i)
                if ntype & N_EXT and not ntype & N_PEXT and (ntype & N_TYPE) == N_SECT:  # not hidden
                    end = blob.index(b"\0", stroff + strx)
                    exported.add(blob[stroff + strx:end].decode().removeprefix("_"))
        pos += cmdsize
    return MachO(CPU_NAMES.get(cpu & 0xFFFFFFFF, hex(cpu & 0xFFFFFFFF)), platform, minos, exported)


def _signed(u: int) -> int:
    return u - (1 << 32) if u >= 1 << 31 else u
