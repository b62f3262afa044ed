"""The lab VM's Python on a block device: the interpreter's libraries as one read-only ext4 image.

Why: the lab VM sees the host's files over 9p, where every open and stat is a round trip through QEMU. Under
software emulation that cost ~20-30 ms per file (measured: reading pandas' 1900 .pyc files took 50-76 s, a bare
`python -c pass` 8.5 s, `import numpy` 12-78 s), and every agent, sampler and probe is a fresh interpreter. The
same trees on a virtio-blk ext4 image are read through the guest's own page cache.

What goes in: the standard library, the virtualenv's site-packages and Debian's dist-packages (mininet, pyverbs),
copied as they are on the host. The guest mounts the image read-only and bind-mounts each tree over its own path,
so paths, versions and behaviour are the host's. The image is rebuilt when a tree changed (a fingerprint of the
trees' and their top-level entries' mtimes), under a lock, so concurrent `testbed vm` calls share one image.
Nothing here is needed for correctness: when the image cannot be made (no mke2fs) the VM reads the trees over 9p.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

SERIAL = "tbpython"  # the virtio-blk serial the guest looks for
MOUNT_POINT = "/run/testbed-python"


def python_trees() -> list[Path]:
    """The folders an interpreter of this virtualenv imports from (existing ones, no nesting)."""
    paths = sysconfig.get_paths()
    cands = [paths["stdlib"], paths["purelib"], "/usr/lib/python3/dist-packages"]
    out: list[Path] = []
    for c in cands:
        p = Path(c).resolve()
        if p.is_dir() and p not in out and not any(p.is_relative_to(o) or o.is_relative_to(p) for o in out):
            out.append(p)
    return out


def fingerprint(trees: list[Path]) -> str:
    """Changes when a package is added, removed or replaced in any tree (its top-level entries' mtimes)."""
    h = hashlib.sha256()
    for t in trees:
        h.update(f"{t}\0{t.stat().st_mtime_ns}\0".encode())
        for e in sorted(os.scandir(t), key=lambda e: e.name):
            st = e.stat(follow_symlinks=False)
            h.update(f"{e.name}\0{st.st_mtime_ns}\0{st.st_size}\0".encode())
    return h.hexdigest()


def _du(path: Path) -> int:
    total = 0
    for root, dirs, files in os.walk(path):
        total += 4096 * (len(dirs) + 1)
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size + 4096
            except OSError:
                pass
    return total


def ensure_image(cache_dir: Path, say=lambda m: None) -> tuple[Path, list[Path]] | None:
    """(image, trees): the current image of the Python trees, built if missing or stale; None if it cannot be."""
    mke2fs = shutil.which("mke2fs") or ("/usr/sbin/mke2fs" if os.path.exists("/usr/sbin/mke2fs") else None)
    if not mke2fs:
        say("no mke2fs: the VM reads Python over 9p (slow)")
        return None
    trees = python_trees()
    cache_dir.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256("\0".join(map(str, trees)).encode()).hexdigest()[:10]  # one image per virtualenv
    image, stamp = cache_dir / f"vm-python-{key}.ext4", cache_dir / f"vm-python-{key}.json"
    fp = fingerprint(trees)
    with open(cache_dir / f"vm-python-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if image.exists() and json.loads(stamp.read_text()).get("fingerprint") == fp:
                return image, trees
        except (OSError, ValueError):
            pass
        say("building the lab VM's Python image (once per change of the installed packages)")
        staging = cache_dir / f"vm-python-{key}.staging"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        tmp = image.with_suffix(".tmp")
        try:
            for i, t in enumerate(trees):
                (staging / str(i)).mkdir()
                subprocess.run(["cp", "-a", f"{t}/.", str(staging / str(i))], check=True, capture_output=True)
            size_kb = int(_du(staging) * 1.25 / 1024) + 65536
            tmp.unlink(missing_ok=True)
            r = subprocess.run([mke2fs, "-q", "-F", "-t", "ext4", "-O", "^has_journal", "-m", "0", "-L", SERIAL,
                                "-d", str(staging), str(tmp), f"{size_kb}k"], capture_output=True, text=True)
            if r.returncode != 0:
                say(f"mke2fs failed ({r.stderr.strip()[-200:]}): the VM reads Python over 9p (slow)")
                tmp.unlink(missing_ok=True)
                return None
            os.replace(tmp, image)
            shutil.rmtree(cache_dir / "mplconfig", ignore_errors=True)  # matplotlib may have changed too
            stamp.write_text(json.dumps({"fingerprint": fp, "trees": [str(t) for t in trees]}) + "\n")
        except (OSError, subprocess.CalledProcessError) as e:
            say(f"could not build the VM's Python image ({e}): the VM reads Python over 9p (slow)")
            tmp.unlink(missing_ok=True)
            return None
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return image, trees


def font_cache(cache_dir: Path) -> Path | None:
    """A matplotlib config folder holding a font list built on the host (1 s here, minutes in the emulated VM,
    whose HOME is a fresh tmpfs each boot). None when matplotlib is not installed."""
    import sys

    d = cache_dir / "mplconfig"
    if not list(d.glob("fontlist-*.json")):
        d.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-c", "import matplotlib.font_manager"], capture_output=True,
                       env=dict(os.environ, MPLCONFIGDIR=str(d)), timeout=120)
    return d if list(d.glob("fontlist-*.json")) else None


def qemu_args(image: Path) -> list[str]:
    """QEMU arguments attaching the image read-only (a shared lock: several VMs may use it at once)."""
    return ["-drive", f"if=none,id={SERIAL},file={image},format=raw,readonly=on",
            "-device", f"virtio-blk-pci,drive={SERIAL},serial={SERIAL}"]


def guest_script(trees: list[Path], fonts: Path | None = None) -> str:
    """Shell lines for the guest: mount the image and put each tree over its own path (silently skipped if the
    device is not there: then the trees are simply read over 9p); seed matplotlib's font list into HOME."""
    seed = (f"mkdir -p /root/.cache/matplotlib && cp {fonts}/fontlist-*.json /root/.cache/matplotlib/ "
            "2>/dev/null\n") if fonts else ""  # matplotlib keeps its font list in its cache dir, ~/.cache/matplotlib
    binds = "\n".join(f"  mount --bind {MOUNT_POINT}/{i} {t}" for i, t in enumerate(trees))
    return (
        "modprobe -q virtio_blk 2>/dev/null; modprobe -q ext4 2>/dev/null\n"
        f"for d in /sys/block/vd*; do [ \"$(cat $d/serial 2>/dev/null)\" = {SERIAL} ] && tbdev=/dev/${{d##*/}}; done\n"
        f"if [ -n \"$tbdev\" ] && mkdir -p {MOUNT_POINT} && mount -t ext4 -o ro,noload \"$tbdev\" {MOUNT_POINT}; then\n"
        f"{binds}\n"
        "fi\n" + seed
    )
