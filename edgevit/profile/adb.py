"""Phones over `adb`: discovery, device facts, and `benchmark_model` runs
per delegate with timeouts and clean-up.

Everything goes through the real `adb` client found on PATH (Debian package
`adb`); each call has a timeout, and every problem a user can fix (no adb,
no phone, unauthorized, offline, binary for another ABI) ends in one message.
"""
from __future__ import annotations

import os
import re
import secrets
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable

from edgevit.errors import EdgevitError
from edgevit.profile.benchmark_binary import ABI_ARCH, benchmark_args, record_from_output

REMOTE_ROOT = "/data/local/tmp"
THERMAL_STATUS = {0: "none", 1: "light", 2: "moderate", 3: "severe", 4: "critical", 5: "emergency",
                  6: "shutdown"}
STATE_HELP = {
    "unauthorized": "is unauthorized: unlock the phone and accept the 'Allow USB debugging?' prompt, then retry",
    "offline": "is offline: replug the USB cable (or run `adb reconnect offline`) and retry",
    "no permissions": "cannot be opened (no permissions): add a udev rule for the phone "
                      "or put your user in the plugdev group",
    "authorizing": "is still authorizing: wait a few seconds and retry",
    "connecting": "is still connecting: wait a few seconds and retry",
    "bootloader": "is in the bootloader, not booted into Android",
    "recovery": "is in recovery mode, not booted into Android",
    "sideload": "is in sideload mode, not booted into Android",
}


@dataclass
class Device:
    serial: str
    state: str
    attrs: dict = field(default_factory=dict)

    def problem(self) -> str | None:
        if self.state == "device":
            return None
        return f"Device {self.serial} " + STATE_HELP.get(self.state, f"is in state {self.state!r}, not usable")


def parse_devices(text: str) -> list[Device]:
    """`adb devices -l` output -> devices (serial, state, key:value attributes)."""
    devices = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("List of devices") or line.startswith("*"):
            continue
        parts = line.split()
        serial, rest = parts[0], line[len(parts[0]):].strip()
        if rest.startswith("no permissions"):
            state = "no permissions"
        else:
            state = parts[1] if len(parts) > 1 else "unknown"
        attrs = dict(p.split(":", 1) for p in parts[2:] if ":" in p and not p.startswith("("))
        devices.append(Device(serial, state, attrs))
    return devices


def parse_getprop(text: str) -> dict:
    return dict(re.findall(r"^\[([^\]]+)\]:\s*\[(.*)\]\s*$", text, flags=re.M))


def parse_thermal(text: str) -> dict:
    """`dumpsys thermalservice`: overall status and the hottest HAL sensor."""
    out: dict = {}
    m = re.search(r"Thermal Status:\s*(\d+)", text)
    if m:
        out["status"] = THERMAL_STATUS.get(int(m.group(1)), m.group(1))
    section = text.split("Current temperatures from HAL:", 1)
    temps = re.findall(r"Temperature\{mValue=([-\d.]+), mType=(-?\d+), mName=([^,]+)",
                       section[1].split("Current cooling devices", 1)[0] if len(section) > 1 else text)
    if temps:
        value, _, name = max(temps, key=lambda t: float(t[0]))
        out["max_temp_c"], out["hottest_sensor"] = float(value), name
    return out


class Adb:
    """Thin wrapper over the `adb` client with timeouts and clear errors."""

    def __init__(self, executable: str | None = None):
        self.executable = executable or shutil.which("adb")
        if not self.executable:
            raise EdgevitError("adb is not on PATH: install Android platform tools "
                               "(Debian/Ubuntu: `sudo apt install adb`) to benchmark on phones.")

    def run(self, args: list[str], timeout: float = 60.0, serial: str | None = None) -> subprocess.CompletedProcess:
        cmd = [self.executable, *(["-s", serial] if serial else []), *args]
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            where = f" on {serial}" if serial else ""
            raise AdbTimeout(f"`adb {' '.join(args)[:80]}`{where} did not finish within {timeout:.0f} s.") from None
        except OSError as err:
            raise EdgevitError(f"Cannot run adb ({self.executable}): {err.strerror}.") from None

    def devices(self) -> list[Device]:
        proc = self.run(["devices", "-l"], timeout=30)
        if proc.returncode != 0:
            raise EdgevitError(f"`adb devices` failed: {_tail(proc.stderr or proc.stdout)}")
        return parse_devices(proc.stdout)

    def shell(self, serial: str, command: str, timeout: float = 60.0) -> tuple[int, str]:
        proc = self.run(["shell", command], timeout=timeout, serial=serial)
        _raise_if_device_gone(serial, proc)
        return proc.returncode, proc.stdout + ("\n" + proc.stderr if proc.stderr else "")

    def push(self, serial: str, local: str | Path, remote: str, timeout: float = 300.0) -> None:
        proc = self.run(["push", str(local), remote], timeout=timeout, serial=serial)
        _raise_if_device_gone(serial, proc)
        if proc.returncode != 0:
            raise EdgevitError(f"Copying {Path(local).name} to {serial}:{remote} failed: "
                               f"{_tail(proc.stderr or proc.stdout)}")


class AdbTimeout(EdgevitError):
    pass


def _tail(text: str) -> str:
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def _raise_if_device_gone(serial: str, proc: subprocess.CompletedProcess) -> None:
    err = (proc.stderr or "") + (proc.stdout or "" if proc.returncode else "")
    if re.search(r"device '.*' not found|no devices/emulators found|device offline|device unauthorized", err):
        raise EdgevitError(f"Device {serial} went away: {_tail(err)}")


def select_devices(adb: Adb, serial: str | None = None, all_devices: bool = False,
                   warn: Callable[[str], None] = lambda msg: None) -> list[Device]:
    devices = adb.devices()
    listing = ", ".join(f"{d.serial} ({d.state})" for d in devices)
    if not devices:
        raise EdgevitError("No Android device attached (`adb devices` lists none): connect a phone with "
                           "USB debugging enabled, or use `adb connect HOST:PORT` for Wi-Fi debugging.")
    if serial:
        match = [d for d in devices if d.serial == serial]
        if not match:
            raise EdgevitError(f"Device {serial} is not attached (adb lists: {listing}).")
        if match[0].problem():
            raise EdgevitError(match[0].problem() + ".")
        return match
    usable = [d for d in devices if d.state == "device"]
    for d in devices:
        if d.problem():
            (warn if usable else (lambda m: None))(f"skipping: {d.problem()}")
    if not usable:
        problems = "; ".join(d.problem() for d in devices)
        raise EdgevitError(f"No usable Android device: {problems}.")
    return usable


def device_facts(adb: Adb, device: Device) -> dict:
    """Model, SoC/board, Android version, ABI and thermal state (where readable)."""
    rc, out = adb.shell(device.serial, "getprop", timeout=30)
    props = parse_getprop(out) if rc == 0 else {}
    manufacturer = props.get("ro.product.manufacturer", "")
    model = props.get("ro.product.model") or device.attrs.get("model", "").replace("_", " ") or device.serial
    soc = " ".join(x for x in (props.get("ro.soc.manufacturer", ""), props.get("ro.soc.model", "")) if x)
    board = props.get("ro.board.platform") or props.get("ro.hardware") or props.get("ro.product.board", "")
    sdk = props.get("ro.build.version.sdk", "")
    facts = {
        "serial": device.serial,
        "model": f"{manufacturer} {model}".strip() if manufacturer and not model.startswith(manufacturer) else model,
        "soc": soc or board or "unknown",
        "board": board or "unknown",
        "android": props.get("ro.build.version.release", "unknown"),
        "sdk": int(sdk) if sdk.isdigit() else None,
        "abi": props.get("ro.product.cpu.abi", "unknown"),
        "thermal": read_thermal(adb, device.serial),
    }
    return facts


def read_thermal(adb: Adb, serial: str) -> dict:
    try:
        rc, out = adb.shell(serial, "dumpsys thermalservice", timeout=30)
    except AdbTimeout:
        return {"status": "unknown"}
    return (parse_thermal(out) if rc == 0 else {}) or {"status": "unknown"}


def thermal_label(thermal: dict) -> str:
    status = thermal.get("status", "unknown")
    temp = thermal.get("max_temp_c")
    return status + (f", {temp:.1f} C {thermal.get('hottest_sensor', '')}".rstrip() if temp is not None else "")


@dataclass
class DeviceRun:
    models: list[Path]
    binary: Path
    binary_arch: str
    delegates: list[str]
    threads: list[int]
    runs: int = 50
    warmup: int = 5
    op_profiling: bool = False
    peak_memory: bool = False
    nnapi_accelerator: str | None = None
    timeout: float = 300.0


def bench_device(adb: Adb, facts: dict, job: DeviceRun,
                 on_step: Callable[[str], None] = lambda msg: None) -> list[dict]:
    """Push binary and models into a fresh folder under /data/local/tmp, run
    every (model, delegate, threads), and remove the folder again."""
    serial = facts["serial"]
    base = {"target": serial, "device": facts["model"]}
    device_arch = ABI_ARCH.get(facts.get("abi", ""), facts.get("abi"))
    if device_arch != job.binary_arch:
        raise EdgevitError(f"{job.binary.name} is built for {job.binary_arch} but {serial} ({facts['model']}) "
                           f"is {facts.get('abi')}: pass the benchmark_model build for that ABI.")
    remote = f"{REMOTE_ROOT}/edgevit-{os.getpid()}-{secrets.token_hex(3)}"
    remote_bin = f"{remote}/benchmark_model"
    rows: list[dict] = []
    try:
        adb.shell(serial, f"mkdir -p {remote}", timeout=30)
        on_step(f"{serial}: pushing {job.binary.name}")
        adb.push(serial, job.binary, remote_bin)
        adb.shell(serial, f"chmod 755 {remote_bin}", timeout=30)
        for model in job.models:
            remote_model = f"{remote}/{re.sub(r'[^A-Za-z0-9._-]', '_', model.name)}"
            on_step(f"{serial}: pushing {model.name}")
            adb.push(serial, model, remote_model)
            for delegate in job.delegates:
                # Threads only matter for the CPU; GPU/NNAPI run once.
                for threads in (job.threads if delegate == "cpu" else job.threads[:1]):
                    on_step(f"{serial}: {model.name} {delegate}" + (f" x{threads}" if delegate == "cpu" else ""))
                    args = benchmark_args(remote_model, delegate, threads, job.runs, job.warmup,
                                          job.op_profiling, job.peak_memory, job.nnapi_accelerator)
                    row = {**base, "model_file": model.name, "threads": threads if delegate == "cpu" else None}
                    try:
                        rc, out = adb.shell(serial, " ".join(shlex.quote(a) for a in [remote_bin, *args]),
                                            timeout=job.timeout)
                    except AdbTimeout:
                        _kill_remote(adb, serial, remote_bin)
                        rows.append({**row, "runtime": "benchmark_model", "delegate": delegate,
                                     "status": "timeout",
                                     "error": f"benchmark_model gave no result within {job.timeout:.0f} s"})
                        continue
                    rows.append({**row, **record_from_output(out, rc, delegate)})
    finally:
        try:
            adb.shell(serial, f"rm -rf {remote}", timeout=30)
        except EdgevitError:
            pass
    return rows


def _kill_remote(adb: Adb, serial: str, remote_bin: str) -> None:
    """Stop our own benchmark process (matched by its unique folder)."""
    try:
        adb.shell(serial, f"pkill -f {remote_bin}", timeout=15)
    except EdgevitError:
        pass
