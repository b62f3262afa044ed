"""eBPF programs in the kernel: compiled from C with clang (``-target bpf``) and loaded with libbpf, the kernel
project's own loader, through ctypes (no Python binding is packaged for it). What this module stands for: what
``tc filter add ... bpf obj prog.o da`` does, in-process, so the program's maps stay open in the process that
reads and writes them while the run goes (the flowlet balancer's congestion table, its counters).

An object is compiled once per change of its source (cached under /var/cache/testbed/bpf by the source's hash)
and loaded once per router that runs it: each load has its own maps."""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

CACHE_DIR = Path("/var/cache/testbed/bpf")
#: uapi headers for the target's asm/ directory on Debian/Ubuntu multiarch
INCLUDES = ("-I/usr/include/x86_64-linux-gnu",)


class BpfError(RuntimeError):
    """A program that could not be compiled, loaded or attached (the message names what and why)."""


def _libbpf() -> ctypes.CDLL:
    name = ctypes.util.find_library("bpf") or "libbpf.so.1"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError as e:
        raise BpfError(f"libbpf is missing ({e}): install libbpf1 (scripts/install.sh does)") from e
    vp, cp, i, u64 = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint64
    for fn, res, args in (("bpf_object__open_file", vp, [cp, vp]), ("bpf_object__load", i, [vp]),
                          ("bpf_object__close", None, [vp]),
                          ("bpf_object__find_program_by_name", vp, [vp, cp]), ("bpf_program__fd", i, [vp]),
                          ("bpf_object__find_map_fd_by_name", i, [vp, cp]),
                          ("bpf_map_update_elem", i, [i, vp, vp, u64]), ("bpf_map_lookup_elem", i, [i, vp, vp])):
        f = getattr(lib, fn)
        f.restype, f.argtypes = res, args
    return lib


_LIB: ctypes.CDLL | None = None


def lib() -> ctypes.CDLL:
    global _LIB
    if _LIB is None:
        _LIB = _libbpf()
    return _LIB


def compile_object(source: Path) -> Path:
    """The object file of `source`, compiled now unless the cache has it."""
    text = source.read_bytes()
    digest = hashlib.sha256(text + " ".join(INCLUDES).encode()).hexdigest()[:16]
    out = CACHE_DIR / f"{source.stem}-{digest}.o"
    if out.exists():
        return out
    clang = shutil.which("clang")
    if clang is None:
        raise BpfError("clang is missing: the flowlet balancer is an eBPF program compiled with clang -target bpf "
                       "(scripts/install.sh installs clang and libbpf-dev)")
    try:
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        probe = CACHE_DIR / f".w{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError:  # a read-only /var (the lab VM's view of the host): compile into a private temporary folder
        out = Path(tempfile.mkdtemp(prefix="testbed-bpf-")) / out.name
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    r = subprocess.run([clang, "-O2", "-g", "-target", "bpf", *INCLUDES, "-c", str(source), "-o", str(tmp)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise BpfError(f"clang could not compile {source.name}: {r.stderr.strip()[-800:]}")
    tmp.replace(out)
    return out


class BpfObject:
    """One loaded copy of an object: its programs' and maps' file descriptors, open until :meth:`close`."""

    def __init__(self, path: Path):
        self._lib = lib()
        obj = self._lib.bpf_object__open_file(str(path).encode(), None)
        if not obj:
            raise BpfError(f"libbpf could not open {path}: {os.strerror(ctypes.get_errno())}")
        if self._lib.bpf_object__load(obj) != 0:
            err = ctypes.get_errno()
            self._lib.bpf_object__close(obj)
            raise BpfError(f"the kernel refused {path.name}: {os.strerror(err)} (the verifier's log is above; "
                           "needs CONFIG_BPF_SYSCALL and CAP_BPF)")
        self._obj = obj
        self._map_fds: dict[str, int] = {}  # looked up once: the controller writes a map every poll

    def program_fd(self, name: str) -> int:
        prog = self._lib.bpf_object__find_program_by_name(self._obj, name.encode())
        if not prog:
            raise BpfError(f"no program {name} in the object")
        return self._lib.bpf_program__fd(prog)

    def map_fd(self, name: str) -> int:
        if name not in self._map_fds:
            fd = self._lib.bpf_object__find_map_fd_by_name(self._obj, name.encode())
            if fd < 0:
                raise BpfError(f"no map {name} in the object")
            self._map_fds[name] = fd
        return self._map_fds[name]

    def update(self, map_name: str, key: ctypes.Structure | ctypes._SimpleCData,
               value: ctypes.Structure | ctypes._SimpleCData) -> None:
        if self._lib.bpf_map_update_elem(self.map_fd(map_name), ctypes.byref(key), ctypes.byref(value), 0) != 0:
            raise BpfError(f"map {map_name} update: {os.strerror(ctypes.get_errno())}")

    def lookup(self, map_name: str, key, value):
        """Fill `value` from the map; False when the key is absent."""
        return self._lib.bpf_map_lookup_elem(self.map_fd(map_name), ctypes.byref(key), ctypes.byref(value)) == 0

    def close(self) -> None:
        if self._obj:
            self._lib.bpf_object__close(self._obj)
            self._obj = None


__all__ = ["BpfError", "BpfObject", "CACHE_DIR", "compile_object", "lib"]
