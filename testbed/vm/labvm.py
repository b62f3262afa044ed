"""The lab VM: run one command as root inside a throwaway microVM with a full stock Debian kernel.

Why: the machines many labs run on (containers, WSL2, minimal cloud kernels, and this project's own CI) have no
sch_red, netem, prio, DCTCP, SoftRoCE or Open vSwitch, and cannot load modules. virtme-ng boots a Debian kernel in
QEMU over the host's own root filesystem (read-only 9p), runs one command, and powers off. The kernel's modules sit
under /lib/modules/<release>/ on the host, so modprobe inside finds them.

What the caller gets:
- the same working directory, PATH, virtualenv and environment variables it named (TESTBED_*, PYTHON*, VIRTUAL_ENV);
- read-write access, at the same paths, to the checkout, the working directory, any `--out DIR` in the command
  and any folder passed with `--rwdir` (everything else is read-only or a throwaway overlay: /etc, /var, /tmp);
- the command's stdout and stderr, streamed while it runs, and its exit status as its own.

Boot cost (about 12 s under software emulation) is paid once per `testbed vm` call, so a whole pytest session runs
inside one VM.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from testbed.vm import image as vmimage
from testbed.vm import relay
from testbed.errors import UsageError

CACHE_DIR = Path(os.environ.get("TESTBED_CACHE", "/var/cache/testbed"))
KERNEL_RELEASE_FILE = CACHE_DIR / "vm-kernel-release"
KVM_VERDICT_FILE = CACHE_DIR / "kvm-verdict"
PROJECT_ROOT = Path(__file__).resolve().parents[2]
#: QEMU's CPU model under software emulation: x86-64-v2 (SSE4.2, POPCNT: numpy's baseline), no AVX
SOFTWARE_CPU = "Nehalem"
#: written by testbed.kernel.keyhold in the guest once the static keys are held (the guest's own tmpfs /tmp)
KEYHOLD_READY = "/tmp/testbed-keyhold.ready"
# Variables passed into the guest as they are on the host.
PASSED_ENV_PREFIXES = ("TESTBED_", "PYTHON", "VIRTUAL_ENV", "PYTEST", "HYPOTHESIS", "CI", "LANG", "LC_", "TERM",
                       "OPENBLAS_")


def in_vm() -> bool:
    """True inside a lab VM started by `testbed vm`."""
    return os.environ.get("TESTBED_IN_VM") == "1"


def vm_kernel() -> tuple[str, Path]:
    """The installed lab-VM kernel as (release, vmlinuz path); UsageError when none is installed."""
    override = os.environ.get("TESTBED_VM_KERNEL")
    candidates: list[str] = []
    if override:
        candidates.append(override)
    elif KERNEL_RELEASE_FILE.exists():
        candidates.append(KERNEL_RELEASE_FILE.read_text().strip())
    else:
        modules = Path("/lib/modules")
        if modules.is_dir():
            candidates += sorted((p.name for p in modules.iterdir()), reverse=True)
    for release in candidates:
        image = Path("/lib/modules") / release / "vmlinuz"
        if image.is_file() and (image.parent / "modules.dep").is_file():
            return release, image
    raise UsageError(
        "no lab-VM kernel installed (expected /lib/modules/<release>/vmlinuz with modules.dep): "
        "run scripts/install.sh"
    )


def _vng() -> str:
    here = Path(sys.executable).parent / "vng"
    if here.exists():
        return str(here)
    found = shutil.which("vng")
    if not found:
        raise UsageError("virtme-ng (vng) is not installed: run scripts/install.sh")
    return found


def _qemu_ok() -> None:
    if not shutil.which("qemu-system-x86_64"):
        raise UsageError("qemu-system-x86_64 is not installed (Debian package qemu-system-x86): run scripts/install.sh")


@dataclass
class VmOptions:
    memory: str = "3G"
    cpus: int = 0  # 0: all host cores
    kvm: str = "auto"  # auto | on | off
    rwdirs: list[str] = field(default_factory=list)
    verbose: bool = False
    timeout_s: float | None = None
    interactive: bool = False  # relay this terminal's input lines to the command (testbed cli in the VM)




def kvm_usable(release: str, image: Path, verbose: bool = False) -> bool:
    """Whether KVM acceleration boots this kernel here, decided by trying once and cached per host+guest kernel.

    /dev/kvm can exist and still be useless (nested virtualisation that hangs a stock kernel's boot); so we detect
    by booting `true` with KVM under a short timeout instead of assuming.
    """
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return False
    key = f"{os.uname().release} {release}"
    if KVM_VERDICT_FILE.exists():
        saved = KVM_VERDICT_FILE.read_text().split("\n")
        if saved and saved[0] == key and len(saved) > 1:
            return saved[1] == "yes"
    cmd = [_vng(), "--run", str(image), "-m", "1G", "--force-9p", "--", "true"]
    try:
        ok = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=40).returncode == 0
    except subprocess.TimeoutExpired:
        ok = False
    try:
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        KVM_VERDICT_FILE.write_text(f"{key}\n{'yes' if ok else 'no'}\n")
    except OSError:
        pass
    if verbose:
        print(f"testbed vm: KVM {'works' if ok else 'does not boot this kernel; using software emulation'}",
              file=sys.stderr)
    return ok


def _out_dirs(argv: list[str]) -> list[str]:
    """Folders named by `--out DIR` / `--out=DIR` / `--basetemp DIR` in the command: made writable in the guest."""
    found = []
    for i, a in enumerate(argv):
        for flag in ("--out", "--basetemp", "--rwdir"):
            if a == flag and i + 1 < len(argv):
                found.append(argv[i + 1])
            elif a.startswith(flag + "="):
                found.append(a.split("=", 1)[1])
    return found


def _compile_project() -> None:
    """Byte-compile the project's own packages and scenario scripts on the host (fast here, and the VM then loads
    .pyc files instead of compiling every module in every fresh interpreter under software emulation)."""
    import compileall

    for pkg in ("testbed", "traffic", "analysis", "topologies", "scenarios"):
        if (PROJECT_ROOT / pkg).is_dir():
            try:
                compileall.compile_dir(str(PROJECT_ROOT / pkg), quiet=2)
            except OSError:
                pass


def run(argv: list[str], options: VmOptions | None = None) -> int:
    """Run argv inside the lab VM; return its exit status. UsageError before booting when something is missing."""
    options = options or VmOptions()
    if not argv:
        raise UsageError("testbed vm: no command given (usage: testbed vm [--] CMD ...)")
    if os.geteuid() != 0:
        raise UsageError("testbed vm needs root (run it with sudo)")
    if in_vm():
        # Already inside: just run it.
        return subprocess.call(argv)
    release, image = vm_kernel()
    vng = _vng()
    _qemu_ok()
    if options.kvm not in ("auto", "on", "off"):
        raise UsageError(f"--kvm must be auto, on or off (got {options.kvm!r})")

    results = Path(tempfile.mkdtemp(prefix="testbed-vm-", dir="/tmp"))
    # SIGTERM from here on ends as Ctrl-C does (the Python image can take minutes to build): the folder goes too
    old_term = signal.signal(signal.SIGTERM, _interrupt) if threading.current_thread() is threading.main_thread() \
        else None
    try:
        os.chmod(results, 0o755)
        rw_final = _rw_dirs(results, argv, options)
        _compile_project()
        pyimage = None if os.environ.get("TESTBED_VM_PYIMAGE") == "0" else \
            vmimage.ensure_image(CACHE_DIR, say=lambda m: print(f"testbed vm: {m}", file=sys.stderr))
        script = _guest_script(results, argv, options, pyimage)
        cmd = _vng_command(vng, release, image, options, pyimage, rw_final, script)
        env = dict(os.environ)
        env["PATH"] = f"{Path(vng).parent}:{env.get('PATH', '')}"
        return _boot_and_collect(cmd, env, results, options)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: _boot ended QEMU; its results folder goes too
        if not os.environ.get("TESTBED_VM_KEEP"):
            shutil.rmtree(results, ignore_errors=True)
        raise
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)


def _rw_dirs(results: Path, argv: list[str], options: VmOptions) -> list[str]:
    """The folders the guest may write (the results folder, the checkout, the working directory, every --out DIR in
    argv and every --rwdir), without those inside another one: a nested 9p mount is fragile and needs no mount."""
    rwdirs = {str(results), str(PROJECT_ROOT), str(Path.cwd())}
    for d in list(options.rwdirs) + _out_dirs(argv):
        p = Path(d).resolve()
        p.mkdir(parents=True, exist_ok=True)
        rwdirs.add(str(p))
    ordered = sorted(rwdirs, key=len)
    return [d for d in ordered if not any(d != o and d.startswith(o.rstrip("/") + "/") for o in ordered)]


def _guest_script(results: Path, argv: list[str], options: VmOptions, pyimage) -> Path:
    """results/guest.sh: what the guest runs as root: the passed environment, a writable /root and /tmp, the
    guest's Python image (when there is one), then argv in the same working directory, its exit status in
    results/rc (an interactive command reads its stdin through the relay)."""
    guest_python = vmimage.guest_script(pyimage[1], vmimage.font_cache(CACHE_DIR)) if pyimage else ""
    env_lines = []
    for k, v in os.environ.items():
        if k == "PATH" or k.startswith(PASSED_ENV_PREFIXES):
            env_lines.append(f"export {k}={shlex.quote(v)}")
    # A host's OPENBLAS_CORETYPE (e.g. Haswell) names instructions a guest CPU without AVX2 lacks: use the guest's own
    env_lines.append('grep -qw avx2 /proc/cpuinfo || { [ -z "${OPENBLAS_CORETYPE:-}" ] || '
                     'export OPENBLAS_CORETYPE=Nehalem; }')
    script = results / "guest.sh"
    script.write_text(
        "#!/bin/sh\n"
        "# Written by testbed vm; runs as root inside the lab VM.\n"
        f": > {shlex.quote(str(results / 'started'))}\n"
        + "\n".join(env_lines)
        + "\nexport TESTBED_IN_VM=1 HOME=/root\n"
        f"export TESTBED_VM_RESULTS={shlex.quote(str(results))}\n"
        # The root filesystem is read-only 9p: give the guest a private writable /root and a fresh tmpfs /tmp.
        "mount -t tmpfs tmpfs /root 2>/dev/null\n"
        + guest_python
        # Hold the kernel's packet-path static keys on until power-off (testbed/kernel/keyhold.py says why: a code
        # patch under QEMU's software CPU was caught killing the guest).
        + f"PYTHONPATH={shlex.quote(str(PROJECT_ROOT))} {shlex.quote(sys.executable)} -m testbed.kernel.keyhold "
        "</dev/null >/dev/null 2>&1 &\n"
        # ... and wait until they are held (at most 30 s: a holder that cannot start must not stop the command)
        f"i=0; while [ ! -e {KEYHOLD_READY} ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done\n" +
        f"cd {shlex.quote(str(Path.cwd()))} || exit 97\n"
        + (relay.guest_lines(results, argv) if options.interactive else
           f"{shlex.join(argv)} >{shlex.quote(str(results / 'stdout'))} 2>{shlex.quote(str(results / 'stderr'))} "
           "</dev/null\n"
           f"echo $? > {shlex.quote(str(results / 'rc'))}\n")
    )
    return script


def _vng_command(vng: str, release: str, image, options: VmOptions, pyimage, rw_final: list[str],
                 script: Path) -> list[str]:
    """The virtme-ng command line that boots ``image`` and runs ``script``: memory, vCPUs, KVM or QEMU's software
    CPU, the Python image's drive, the writable folders."""
    use_kvm = options.kvm == "on" or (options.kvm == "auto" and kvm_usable(release, image, options.verbose))
    cpus = options.cpus or os.cpu_count() or 1
    cmd = [vng, "--run", str(image), "-m", options.memory, "-p", str(cpus), "--force-9p",
           "--overlay-rwdir", "/etc", "--overlay-rwdir", "/var"]
    if not use_kvm:
        cmd.append("--disable-kvm")
        # The software CPU is a model without AVX (SOFTWARE_CPU): under QEMU's emulation of AVX2 (`-cpu max`,
        # `Haswell`) numpy 2.4 / pandas 3.1 segfaulted in the guest (a pandas groupby: 6 of 6 processes crashed
        # with -cpu Haswell-v4, most with -cpu max; 0 of 4 with Nehalem). TESTBED_VM_CPU picks another model.
        cmd.append(f"--qemu-opts=-cpu {os.environ.get('TESTBED_VM_CPU') or SOFTWARE_CPU}")
    if pyimage:
        cmd.append("--qemu-opts=" + " ".join(vmimage.qemu_args(pyimage[0])))
    tap = os.environ.get("TESTBED_VM_TAP")
    if tap:
        # A second machine on a wire (docs/servers.md): QEMU makes a tap of this name in the network namespace it
        # runs in (start `testbed vm` under nsenter into a tb-* namespace), the guest's first NIC at its far end.
        cmd.append(f"--qemu-opts=-netdev tap,id=tbnet,ifname={tap},script=no,downscript=no "
                   "-device virtio-net-pci,netdev=tbnet")
    for d in rw_final:
        cmd += ["--rwdir", d]
    # The guest kernel's console always goes to vng.log: in full with --verbose, otherwise its warnings and worse
    # (loglevel 4: a panic, an oops, the OOM killer), so a VM that dies mid-run leaves its reason behind.
    cmd.append("--verbose")
    if not options.verbose:
        cmd += ["--append", "loglevel=4"]
    return cmd + ["--", f"sh {shlex.quote(str(script))}"]


def _boot_and_collect(cmd: list[str], env: dict, results: Path, options: VmOptions) -> int:
    """Boot the VM (once more, with the boot log, when the guest never reached the command) and return the
    command's exit status from results/rc; 124: the command timed out; 125: the VM died without reporting one (the
    log's tail goes to stderr)."""
    rc_file = results / "rc"
    returncode = _boot(cmd, env, results, options)
    if returncode == -15 and not rc_file.exists():
        return 124
    if not rc_file.exists() and not (results / "started").exists():
        # The guest never reached the command (an emulated boot that died early, seen once here:
        # vng exit 255, nothing logged). Nothing ran, so booting again is safe; this time with the boot log.
        print(f"testbed vm: the VM exited before running the command (vng exit {returncode}); booting it once "
              "more", file=sys.stderr)
        (results / "vng.log").replace(results / "vng-first.log")
        returncode = _boot(cmd, env, results, options)
        if returncode == -15 and not rc_file.exists():
            return 124
    if not rc_file.exists():
        started = results / "started"
        when = (f"{time.time() - started.stat().st_mtime:.0f} s after the command started" if started.exists()
                else "before the command started")
        tail = (results / "vng.log").read_text(errors="replace")[-3000:]
        print(f"testbed vm: the VM stopped {when} without reporting an exit status (vng exit {returncode}: QEMU "
              f"ended, the guest kernel panicked or powered off); console log: {results / 'vng.log'}\n{tail}",
              file=sys.stderr)
        return 125
    rc = int(rc_file.read_text().strip() or 125)
    if not os.environ.get("TESTBED_VM_KEEP"):
        shutil.rmtree(results, ignore_errors=True)
    return rc


def _boot(cmd: list[str], env: dict, results: Path, options: VmOptions) -> int:
    """One vng run of the guest script; vng's own output goes to results/vng.log, the command's stdout/stderr
    stream to ours while it runs. Returns vng's exit status (-15 after a timeout)."""
    vng_log = open(results / "vng.log", "wb")
    stop = threading.Event()
    streams = [threading.Thread(target=relay.stream, args=(results / name, sink, stop), daemon=True)
               for name, sink in (("stdout", sys.stdout), ("stderr", sys.stderr))]
    for t in streams:
        t.start()
    if options.interactive:
        (results / "stdin").touch()
        threading.Thread(target=relay.feed_stdin, args=(results / "stdin", stop), daemon=True).start()
    proc = subprocess.Popen(cmd, env=env, stdout=vng_log if not options.verbose else None,
                            stderr=subprocess.STDOUT if not options.verbose else None,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    # QEMU runs in its own session (a terminal's Ctrl-C reaches it only through us): SIGTERM ends it as Ctrl-C does
    old_term = signal.signal(signal.SIGTERM, _interrupt) if threading.current_thread() is threading.main_thread() \
        else None
    try:
        proc.wait(timeout=options.timeout_s)
    except subprocess.TimeoutExpired:
        _end(proc)
        print(f"testbed vm: timed out after {options.timeout_s:.0f} s", file=sys.stderr)
        return -15
    except KeyboardInterrupt:
        _end(proc)
        raise
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
        stop.set()
        for t in streams:
            t.join()
        vng_log.close()
    return proc.returncode


def _end(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """End vng and its QEMU (their own session): SIGTERM, then SIGKILL if they are still there after grace_s;
    a second Ctrl-C meanwhile does not leave them running."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt
