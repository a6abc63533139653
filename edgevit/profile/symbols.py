"""Names for code addresses of another process: its memory map
(/proc/PID/maps format) says which file each address comes from, and the
file's ELF symbol table which function.

Used for the emulated Arm64 runs, whose guest addresses are counted by the
instruction-counting plugin. Pure Python (the ELF files are aarch64, so the
host's binutils may not read them all), 64-bit little-endian ELF only.
LiteRT's shared library keeps its full symbol table (XNNPACK's microkernels,
TFLite's builtin kernels, ruy), while stripped libraries such as libc have
only their exported names: code between them is named after its library.
"""
from __future__ import annotations

import bisect
import shutil
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

from edgevit.errors import EdgevitError

_SHT_SYMTAB, _SHT_NOTE, _SHT_DYNSYM = 2, 7, 11
_NT_GNU_BUILD_ID = 3
_STT_FUNC, _STT_GNU_IFUNC = 2, 10
_PT_LOAD = 1


@dataclass(frozen=True)
class Mapping:
    start: int
    end: int
    offset: int
    path: str


def parse_maps(text: str) -> list[Mapping]:
    """The executable, file-backed mappings of a /proc/PID/maps listing."""
    found = []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or "x" not in parts[1] or not parts[5].startswith("/"):
            continue
        start, end = (int(x, 16) for x in parts[0].split("-"))
        found.append(Mapping(start, end, int(parts[2], 16), parts[5].strip()))
    return sorted(found, key=lambda m: m.start)


class ElfFunctions:
    """The function symbols of one ELF file, searchable by virtual address.
    ``symbols_from``: a separate debug file with the full symbol table."""

    def __init__(self, path: str | Path, symbols_from: str | Path | None = None):
        data = Path(path).read_bytes()
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            raise EdgevitError(f"{path} is not a 64-bit little-endian ELF file.")
        phoff, shoff = struct.unpack_from("<QQ", data, 0x20)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, 0x36)
        # (file offset, virtual address, size in the file) of each loaded segment
        self.segments = []
        for i in range(phnum):
            p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
            if p_type == _PT_LOAD:
                self.segments.append((p_offset, p_vaddr, p_filesz))
        sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
        self.build_id = _build_id(data, sections)
        if symbols_from is not None:
            data = Path(symbols_from).read_bytes()
            shoff, = struct.unpack_from("<Q", data, 0x28)
            shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
            sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
        tables = {s[1]: s for s in sections if s[1] in (_SHT_SYMTAB, _SHT_DYNSYM)}
        # the full table when the file has one (LiteRT's does); exported names otherwise
        table = tables.get(_SHT_SYMTAB) or tables.get(_SHT_DYNSYM)
        symbols = {}
        if table is not None:
            _, _, _, _, offset, size, link, _, _, entsize = table
            strings = sections[link][4]
            for pos in range(offset, offset + size, entsize):
                name, info, _, _, value, sym_size = struct.unpack_from("<IBBHQQ", data, pos)
                if info & 0xF in (_STT_FUNC, _STT_GNU_IFUNC) and value and sym_size:
                    end = data.index(b"\0", strings + name)
                    symbols.setdefault(value, (value + sym_size, data[strings + name:end].decode(errors="replace")))
        self._starts = sorted(symbols)
        self._entries = [symbols[s] for s in self._starts]

    @property
    def has_symbols(self) -> bool:
        return bool(self._starts)

    def vaddr_of(self, file_offset: int) -> int | None:
        for p_offset, p_vaddr, p_filesz in self.segments:
            if p_offset <= file_offset < p_offset + p_filesz:
                return p_vaddr + file_offset - p_offset
        return None

    def name_at(self, vaddr: int) -> str | None:
        i = bisect.bisect_right(self._starts, vaddr) - 1
        if i >= 0 and vaddr < self._entries[i][0]:
            return self._entries[i][1]
        return None


def _build_id(data: bytes, sections: list[tuple]) -> str | None:
    for section in sections:
        if section[1] != _SHT_NOTE:
            continue
        pos, end = section[4], section[4] + section[5]
        while pos + 12 <= end:
            namesz, descsz, kind = struct.unpack_from("<III", data, pos)
            name_at = pos + 12
            desc_at = name_at + (namesz + 3) // 4 * 4
            if kind == _NT_GNU_BUILD_ID and data[name_at:name_at + namesz] == b"GNU\0":
                return data[desc_at:desc_at + descsz].hex()
            pos = desc_at + (descsz + 3) // 4 * 4
    return None


class AddressNamer:
    """Names guest code addresses: ``function`` where the file's symbol table
    covers the address, else ``[library]``. A stripped library's full table is
    looked up by build ID under ``debug_root``/usr/lib/debug/.build-id (where
    Debian's -dbg packages put it)."""

    def __init__(self, maps_text: str, debug_root: Path | None = None):
        self.debug_root = debug_root
        self.mappings = parse_maps(maps_text)
        self._starts = [m.start for m in self.mappings]
        self._files: dict[str, ElfFunctions | None] = {}

    def name(self, address: int) -> str:
        i = bisect.bisect_right(self._starts, address) - 1
        if i < 0 or address >= self.mappings[i].end:
            return "[unmapped]"
        mapping = self.mappings[i]
        library = Path(mapping.path).name
        functions = self._elf(mapping.path)
        if functions is None:
            return f"[{library}]"
        vaddr = functions.vaddr_of(address - mapping.start + mapping.offset)
        found = functions.name_at(vaddr) if vaddr is not None else None
        return found or f"[{library}]"

    def _elf(self, path: str) -> ElfFunctions | None:
        if path not in self._files:
            try:
                functions = ElfFunctions(path)
                debug = self._debug_file(functions.build_id)
                if debug is not None:
                    functions = ElfFunctions(path, symbols_from=debug)
                self._files[path] = functions
            except (OSError, EdgevitError, struct.error, ValueError, IndexError):
                self._files[path] = None
        return self._files[path]


    def _debug_file(self, build_id: str | None) -> Path | None:
        if self.debug_root is None or not build_id:
            return None
        candidate = self.debug_root / "usr/lib/debug/.build-id" / build_id[:2] / f"{build_id[2:]}.debug"
        return candidate if candidate.is_file() else None


def demangle(names: list[str]) -> dict[str, str]:
    """C++ names in readable form (binutils' c++filt); unchanged without it."""
    mangled = [n for n in names if n.startswith("_Z")]
    tool = shutil.which("c++filt")
    if not mangled or tool is None:
        return {n: n for n in names}
    proc = subprocess.run([tool], input="\n".join(mangled) + "\n", capture_output=True, text=True)
    readable = proc.stdout.splitlines() if proc.returncode == 0 else []
    if len(readable) != len(mangled):
        readable = mangled
    table = dict(zip(mangled, readable))
    return {n: table.get(n, n) for n in names}
