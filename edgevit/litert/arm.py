"""LiteRT's Arm64 CPU kernels, run on this machine under emulation.

Phones run LiteRT's aarch64 build: XNNPACK's NEON / dotprod / i8mm
microkernels, TFLite's builtin kernels built for aarch64 (its int8 SOFTMAX a
table lookup), ruy for the matmuls XNNPACK leaves. Here that build (the
ai-edge-litert 1.4.0 aarch64 wheel, the newest Linux aarch64 LiteRT) runs
unchanged in an arm64 Debian Python under Debian's qemu-user, installed by
scripts/install-arm-emulator.sh into one folder ($EDGEVIT_ARM_HOME, default
~/.cache/edgevit-arm). This module runs a file there (:func:`run_guest`, in
a child process that it kills when interrupted) and compares what it computes
with this machine's x86 XNNPACK (:func:`check_on_arm`: `edgevit check --arm`
and the convert report). The emulated process can also count every guest
instruction of the inferences it runs, per code address; edgevit.profile.arm
turns those counts into instructions per inference by kernel family.

A CPU profile picks what XNNPACK sees: qemu's CPU model sets the
instruction-set features (the auxiliary vector), and a fake /proc/cpuinfo
and /sys/devices/system/cpu in the guest's root name the core, which is how
XNNPACK chooses its core-tuned kernels (a guest would otherwise read this
host's x86 cpuinfo and get the generic ones). Every profile describes the
same fixed cluster of four cores, so the choice does not depend on the host.
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from edgevit.errors import EdgevitError
from edgevit.litert.accelerator import AGREEMENT_FLOOR, INTEGER_AGREEMENT_FLOOR, integer_floor, precision_of
from edgevit.litert.emulator_home import HOME_ENV, HOW_TO_INSTALL, arm_home  # noqa: F401  (arm.HOME_ENV: tests)

MARKER_SYSCALL = 0xE7E7
KERNEL_SETS = ("xnnpack", "builtin", "reference")
REFERENCE = "LiteRT XNNPACK on this machine (x86-64)"
CORES = 4
GUEST_SCRIPT = Path(__file__).with_name("arm_guest.py")
CHECK_KERNELS = ("xnnpack", "builtin")
# the held-out sample photos `edgevit check --arm` and `edgevit convert` judge a file on
DEFAULT_IMAGES = 2


@dataclass(frozen=True)
class ArmProfile:
    """What the guest's XNNPACK sees: qemu's CPU model (instruction-set
    features) and the core its fake cpuinfo names (kernel tuning)."""
    name: str
    qemu_cpu: str
    description: str
    part: int | None          # MIDR part number; None: no core named
    variant: int = 0
    revision: int = 0
    features: str = ""        # the kernel's Features line for that core
    max_khz: int = 2000000

    def cpuinfo(self) -> str:
        blocks = []
        for cpu in range(CORES):
            lines = [f"processor\t: {cpu}", "BogoMIPS\t: 50.00", f"Features\t: {self.features}"]
            if self.part is not None:
                lines += ["CPU implementer\t: 0x41", "CPU architecture: 8", f"CPU variant\t: {self.variant:#x}",
                          f"CPU part\t: {self.part:#05x}", f"CPU revision\t: {self.revision}"]
            blocks.append("\n".join(lines) + "\n")
        return "\n".join(blocks)


_V80 = "fp asimd evtstrm aes pmull sha1 sha2 crc32 cpuid"
_V82_DOT = _V80 + " atomics fphp asimdhp asimdrdm lrcpc dcpop asimddp"
PROFILES = {
    "a76": ArmProfile("a76", "cortex-a76", "Cortex-A76 kernels (big core; dotprod, fp16)", 0xD0B, variant=4,
                      revision=1, features=_V82_DOT, max_khz=2400000),
    "max": ArmProfile("max", "max", "qemu's max CPU (i8mm, dotprod, fp16, bf16; no core named, kernels chosen "
                      "by instruction set)", None,
                      features=_V82_DOT + " sha3 sm3 sm4 sha512 asimdfhm flagm ilrcpc uscat i8mm bf16"),
    "a55": ArmProfile("a55", "cortex-a76", "Cortex-A55 kernels (little in-order core; dotprod, fp16)", 0xD05,
                      variant=2, revision=0, features=_V82_DOT, max_khz=1800000),
    "a53": ArmProfile("a53", "cortex-a53", "Cortex-A53 kernels (ARMv8.0: no dotprod, no fp16)", 0xD03,
                      revision=4, features=_V80, max_khz=1500000),
}
ALIASES = {"cortex-a76": "a76", "cortex-a55": "a55", "cortex-a53": "a53", "i8mm": "max"}


def parse_profiles(text: str) -> list[ArmProfile]:
    """``a76,max`` (or ``all``) -> profiles, in the order given."""
    names = [x.strip().lower() for x in text.split(",") if x.strip()]
    if names == ["all"]:
        return list(PROFILES.values())
    if not names:
        raise EdgevitError(f"Name at least one Arm CPU profile: {', '.join(PROFILES)} (or all).")
    unknown = [n for n in names if ALIASES.get(n, n) not in PROFILES]
    if unknown:
        raise EdgevitError(f"Unknown Arm CPU profile {', '.join(unknown)}: choose from {', '.join(PROFILES)} "
                           "(or all).")
    return [PROFILES[ALIASES.get(n, n)] for n in dict.fromkeys(names)]


# ---------------------------------------------------------------- the emulator


@dataclass(frozen=True)
class Emulator:
    home: Path
    versions: dict

    @property
    def qemu(self) -> Path:
        return self.home / "qemu" / "qemu-aarch64"

    @property
    def rootfs(self) -> Path:
        return self.home / "rootfs"

    @property
    def plugin(self) -> Path:
        return self.home / "plugin" / "libinsn_regions.so"

    @property
    def runtime(self) -> str:
        qemu = self.versions.get("qemu", "?").split(":")[-1].split("+")[0]
        return f"LiteRT {self.versions.get('litert', '?')} aarch64 kernels under qemu-user {qemu} (emulated)"

    def command(self, root: Path, profile: ArmProfile, script_args: list[str], counts: Path | None) -> list[str]:
        cmd = [str(self.qemu), "-U", "LD_LIBRARY_PATH", "-L", str(root), "-cpu", profile.qemu_cpu]
        if counts is not None:
            cmd += ["-plugin", f"{self.plugin},out={counts},marker={MARKER_SYSCALL}"]
        return cmd + [str(self.rootfs / "usr/bin/python3.11"), "-s", *script_args]

    def environment(self) -> dict:
        """The emulator's whole environment (qemu passes it to the guest, less
        LD_LIBRARY_PATH, which is for qemu itself): none of this machine's
        PYTHON* variables; a fixed hash seed, so that the Python code around
        a counted invoke runs the same instructions every time; and the
        bytecode the installer compiled, never written again (the guest's
        writes would land in the host's folders: -L redirects only paths that
        exist in the root)."""
        return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp", "OPENBLAS_NUM_THREADS": "1",
                "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONPYCACHEPREFIX": str(self.home / "pycache"), "LD_LIBRARY_PATH": str(self.home / "qemu" / "lib")}


def emulator_missing() -> str | None:
    """Why the emulator cannot run here (None: installed)."""
    home = arm_home()
    if not (home / "manifest.json").is_file():
        return f"the Arm64 emulator is not installed in {home}"
    emulator = Emulator(home, {})
    for path in (emulator.qemu, emulator.rootfs / "usr/bin/python3.11", emulator.plugin):
        if not path.exists():
            return f"the Arm64 emulator in {home} is incomplete ({path.name} is missing)"
    return None


def find_emulator() -> Emulator:
    missing = emulator_missing()
    if missing:
        raise EdgevitError(f"{missing[0].upper()}{missing[1:]}: {HOW_TO_INSTALL}.")
    home = arm_home()
    try:
        versions = json.loads((home / "manifest.json").read_text())
    except (OSError, ValueError):
        raise EdgevitError(f"The Arm64 emulator's manifest in {home} is unreadable: {HOW_TO_INSTALL}.") from None
    return Emulator(home, versions)


def make_root(folder: Path, profile: ArmProfile, rootfs: Path) -> Path:
    """The guest's root for ``profile``: the installed userland (linked) with
    this profile's /proc/cpuinfo and CPU topology in /sys."""
    root = folder / f"root-{profile.name}"
    root.mkdir()
    for entry in rootfs.iterdir():
        (root / entry.name).symlink_to(entry)
    (root / "proc").mkdir()
    (root / "proc" / "cpuinfo").write_text(profile.cpuinfo())
    cpus = root / "sys" / "devices" / "system" / "cpu"
    cpus.mkdir(parents=True)
    every = f"0-{CORES - 1}\n"
    for name, text in (("possible", every), ("present", every), ("online", every), ("kernel_max", "255\n")):
        (cpus / name).write_text(text)
    for cpu in range(CORES):
        (cpus / f"cpu{cpu}" / "cpufreq").mkdir(parents=True)
        (cpus / f"cpu{cpu}" / "topology").mkdir()
        for name, text in (("cpufreq/cpuinfo_max_freq", profile.max_khz), ("cpufreq/cpuinfo_min_freq", 300000),
                           ("topology/physical_package_id", 0), ("topology/core_id", cpu),
                           ("topology/core_siblings_list", every.strip()), ("topology/cluster_cpus_list",
                                                                             every.strip()),
                           ("topology/package_cpus_list", every.strip()), ("topology/thread_siblings_list", cpu)):
            (cpus / f"cpu{cpu}" / name).write_text(f"{text}\n")
    return root


# ---------------------------------------------------------------- one guest run
@dataclass
class GuestRun:
    """What one emulated process computed: per kernel set, the raw outputs
    [N, ...] and their dequantization; when counting, the plugin's dump
    (edgevit.profile.arm reads it) and the guest's memory map."""
    profile: str
    outputs: dict[str, np.ndarray]
    raw: dict[str, np.ndarray]
    output_scale: float | None
    counts: str | None = None
    maps: str | None = None
    seconds: float = 0.0


def run_guest(emulator: Emulator, model_path: str | Path, inputs: np.ndarray, profile: ArmProfile,
              kernels: tuple[str, ...] = ("xnnpack",), threads: int = 1, counted: int = 0, warmup: int = 1,
              timeout: float = 1800) -> GuestRun:
    """Run ``model_path`` on float ``inputs`` [N, ...] (quantized in the guest
    as the input tensor says) in one emulated process, once per kernel set.
    With ``counted`` > 0 (one kernel set only) the first ``counted`` invokes
    are counted, after ``warmup`` uncounted ones."""
    bad = [k for k in kernels if k not in KERNEL_SETS]
    if bad:
        raise EdgevitError(f"Unknown LiteRT kernels {', '.join(bad)}; choose from {', '.join(KERNEL_SETS)}.")
    if counted and len(kernels) != 1:
        raise EdgevitError("Count instructions of one kernel set at a time.")
    model_path = Path(model_path).resolve()
    with tempfile.TemporaryDirectory(prefix="edgevit-arm-") as tmp:
        folder = Path(tmp)
        root = make_root(folder, profile, emulator.rootfs)
        np.save(folder / "inputs.npy", np.asarray(inputs, dtype=np.float32))
        job = {"model": str(model_path), "inputs": str(folder / "inputs.npy"), "threads": threads,
               "kernels": list(kernels), "outputs": str(folder / "outputs"), "warmup": warmup,
               "counted": min(counted, len(inputs)), "marker": MARKER_SYSCALL if counted else 0,
               "maps": str(folder / "maps.txt")}
        (folder / "job.json").write_text(json.dumps(job))
        counts = folder / "counts.txt" if counted else None
        cmd = emulator.command(root, profile, [str(GUEST_SCRIPT), str(folder / "job.json")], counts)
        start = time.perf_counter()
        try:
            returncode, stderr = _run_process(cmd, emulator.environment(), tmp, timeout)
        except subprocess.TimeoutExpired:
            raise EdgevitError(f"The emulated Arm64 run of {model_path.name} ({profile.name}) did not finish "
                               f"within {timeout:.0f} s.") from None
        except OSError as err:
            raise EdgevitError(f"Cannot start the Arm64 emulator {emulator.qemu}: {err.strerror}.") from None
        seconds = time.perf_counter() - start
        if returncode != 0:
            from edgevit.litert.interpreter import describe_child_failure

            raise EdgevitError(f"LiteRT's Arm64 build failed running {model_path.name} ({profile.name}): "
                               f"{describe_child_failure(returncode, stderr)}")
        outputs, raw, scale = {}, {}, None
        for name in kernels:
            data = np.load(folder / f"outputs-{name}.npz")
            raw[name] = data["raw"]
            scale = float(data["scale"]) or None
            outputs[name] = raw[name].astype(np.float32) if scale is None else \
                ((raw[name].astype(np.float32) - int(data["zero_point"])) * scale).astype(np.float32)
        if counted and not counts.is_file():
            raise EdgevitError(f"The instruction-counting plugin wrote nothing for {model_path.name} "
                               f"({profile.name}).")
        return GuestRun(profile.name, outputs, raw, scale, counts.read_text() if counted else None,
                        (folder / "maps.txt").read_text() if counted else None, seconds)


_running: set[subprocess.Popen] = set()
_running_lock = threading.Lock()


def _run_process(cmd: list[str], env: dict, cwd: str, timeout: float) -> tuple[int, str]:
    """(exit status, stderr) of one emulated process; it is killed when the
    caller is interrupted or it runs past ``timeout``."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    with _running_lock:
        _running.add(proc)
    try:
        _, stderr = proc.communicate(timeout=timeout)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        with _running_lock:
            _running.discard(proc)
    return proc.returncode, stderr


def parallel(function, jobs: list) -> list:
    """``function`` over ``jobs``, results in order, as many at once as this
    machine has cores (each job is one single-threaded emulated process). When
    one fails or the caller is interrupted, the others' processes are killed."""
    workers = max(1, min(len(jobs), os.cpu_count() or 1))
    if workers == 1:
        return [function(job) for job in jobs]
    pool = ThreadPoolExecutor(max_workers=workers)
    futures = [pool.submit(function, job) for job in jobs]
    try:
        return [f.result() for f in futures]
    except BaseException:
        for f in futures:
            f.cancel()
        with _running_lock:
            for proc in _running:
                proc.kill()
        raise
    finally:
        pool.shutdown(wait=True)


# ---------------------------------------------------------------- agreement with x86
@dataclass
class ArmAgreement:
    """One (profile, kernel set) run against x86 XNNPACK on the same inputs."""
    profile: str
    kernels: str
    agreement: dict                     # edgevit.litert.agreement
    floor: float
    int8_steps_max: int | None = None   # integer outputs: largest difference in quantization steps
    int8_outputs_off: float | None = None  # integer outputs: fraction that differ at all

    @property
    def agrees(self) -> bool:
        return self.agreement["cosine_mean"] >= self.floor

    def to_dict(self) -> dict:
        return {**asdict(self), "agrees": self.agrees}


@dataclass
class ArmCheck:
    """`edgevit check --arm`: a file on LiteRT's Arm64 kernels against x86."""
    ran: bool
    reason: str = ""
    runtime: str = ""
    images: str = ""
    rows: list[ArmAgreement] = field(default_factory=list)
    # integer files: mean cosine of x86 XNNPACK against x86's builtin and
    # reference kernels (the lower), which sets the floor when below 0.995
    x86_kernels_cosine: float | None = None
    seconds: float = 0.0

    @property
    def agrees(self) -> bool | None:
        return all(r.agrees for r in self.rows) if self.ran else None

    def to_dict(self) -> dict:
        return {"ran": self.ran, "reason": self.reason, "runtime": self.runtime, "images": self.images,
                "reference": REFERENCE, "agrees": self.agrees, "rows": [r.to_dict() for r in self.rows],
                "x86_kernels_cosine": self.x86_kernels_cosine, "seconds": round(self.seconds, 1)}

    def summary(self) -> str:
        """One line for reports."""
        if not self.ran:
            return f"not run: {self.reason}"
        worst = min(self.rows, key=lambda r: r.agreement["cosine_mean"])
        steps = [r.int8_steps_max for r in self.rows if r.int8_steps_max is not None]
        samples = worst.agreement["samples"]
        line = (f"{'agrees with' if self.agrees else 'DISAGREES with'} x86 XNNPACK on {samples} "
                f"image{'s' if samples != 1 else ''} ({', '.join(dict.fromkeys(r.profile for r in self.rows))}; "
                f"{', '.join(dict.fromkeys(r.kernels for r in self.rows))}): "
                f"{'lowest ' if len(self.rows) > 1 else ''}mean cosine {worst.agreement['cosine_mean']:.5f}"
                f"{f' ({worst.profile} {worst.kernels})' if len(self.rows) > 1 else ''}, "
                f"{'pixel argmax' if 'pixels' in worst.agreement else 'top-1'} "
                f"{min(r.agreement['top1_agreement'] for r in self.rows) * 100:.0f}%")
        if steps:
            line += f", int8 outputs at most {max(steps)} step{'s' if max(steps) != 1 else ''} apart" \
                if max(steps) else ", int8 outputs identical"
        if not self.agrees:
            line += f"; the mean cosine must reach {worst.floor:.4g}"
        if worst.floor < INTEGER_AGREEMENT_FLOOR and self.x86_kernels_cosine is not None:
            line += (f"; floor {worst.floor:.4f}: x86's own builtin and reference kernels agree with its XNNPACK "
                     f"only to {self.x86_kernels_cosine:.4f} on these images (integer rounding), and the floor "
                     "is twice that distance")
        return f"{line}; {self.runtime}"


def compare(profile: str, kernels: str, x86: np.ndarray, arm: np.ndarray, floor: float,
            scale: float | None) -> ArmAgreement:
    from edgevit.litert.agreement import agreement, per_image

    n = len(x86)
    a, b = per_image(x86, n), per_image(arm, n)
    row = ArmAgreement(profile, kernels, agreement(a, b), floor)
    if scale:
        steps = np.rint(np.abs(a.astype(np.float64) - b) / scale)
        row.int8_steps_max, row.int8_outputs_off = int(steps.max()), float(np.mean(steps > 0))
    return row


def check_on_arm(model_path: str | Path, profiles: list[ArmProfile], kernels: tuple[str, ...] = CHECK_KERNELS,
                 images: int = 4, inputs: np.ndarray | None = None, images_note: str = "",
                 x86_outputs: np.ndarray | None = None, step: Callable[[str], None] = lambda msg: None,
                 timeout: float = 1800) -> ArmCheck:
    """``model_path`` on each profile's Arm64 kernels (``kernels``) against
    x86 XNNPACK on the same inputs (held-out sample photos by default), on
    its logits where it outputs probabilities (``edgevit.litert.logits_view``);
    a not-run record, saying why, when the emulator is not installed."""
    from edgevit.litert.logits_view import logits_file

    missing = emulator_missing()
    if missing:
        return ArmCheck(False, f"{missing}; {HOW_TO_INSTALL}")
    if inputs is None:
        from edgevit.litert.inputs import inputs_for_file

        inputs, images_note = inputs_for_file(Path(model_path).read_bytes(), images)
    with logits_file(model_path) as path:
        return _check_on_arm(path, profiles, kernels, inputs, images_note, x86_outputs, step, timeout)


def _check_on_arm(path: Path, profiles, kernels, inputs, images_note, x86_outputs, step, timeout) -> ArmCheck:
    from edgevit.litert.run_model import run_in_child

    emulator = find_emulator()
    start = time.perf_counter()
    precision = precision_of(path.read_bytes())
    if x86_outputs is None:
        step(f"x86: running {path.name} with XNNPACK on {len(inputs)} images")
        x86_outputs = run_in_child(path, inputs)
    floor = AGREEMENT_FLOOR.get(precision)
    kernels_cosine = None
    if floor is None:
        # the floor of another kernel set's answers: see integer_floor
        from edgevit.litert.agreement import agreement, per_image

        step(f"x86: running {path.name} with the builtin and reference kernels")
        cosines = []
        for other in ("builtin", "reference"):
            try:
                outputs = run_in_child(path, inputs, kernels=other)
            except EdgevitError:
                # LiteRT 2.3's x86 reference kernels abort (SIGABRT) on some int8 files that XNNPACK and the
                # builtin kernels run (pit_ti and cvt_13 at 224 px): the floor then comes from the others
                continue
            cosines.append(agreement(per_image(x86_outputs, len(inputs)),
                                     per_image(outputs, len(inputs)))["cosine_mean"])
        kernels_cosine = min(cosines, default=None)
        floor = integer_floor(kernels_cosine)

    def one(profile):
        step(f"arm64 {profile.name}: running {path.name} ({'/'.join(kernels)}) on {len(inputs)} images")
        return run_guest(emulator, path, inputs, profile, kernels, timeout=timeout)

    rows = []
    for run in parallel(one, profiles):
        for name in kernels:
            rows.append(compare(run.profile, name, x86_outputs, run.outputs[name], floor, run.output_scale))
    return ArmCheck(True, runtime=emulator.runtime, images=images_note, rows=rows, x86_kernels_cosine=kernels_cosine,
                    seconds=time.perf_counter() - start)


