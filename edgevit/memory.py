"""What the heavy stages (the export's, and training) need in memory, and
one error line when they cannot have it.

The kernel's out-of-memory killer ends a process without a word, so before
a stage starts its need is estimated from the model (its float32 weights,
and the activations of one image: the outputs of its top-level layers at the
input size) and compared with the memory this machine has available (the
kernel's MemAvailable, and what the process's cgroup limit leaves) and with
what the shell's address-space limit (`ulimit -v`) leaves of it: TensorFlow
under that limit crashes (SIGSEGV) or deadlocks where an allocation fails,
so a stage that would pass it is refused before it starts. A stage that
would clearly not fit is refused with what to do. A stage that runs out
anyway (Python's MemoryError, TensorFlow's ResourceExhaustedError, or the
converter failing an allocation) ends in the same kind of line.
"""
from __future__ import annotations

import contextlib
import ctypes
import re
import resource
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from edgevit.errors import EdgevitError, OutOfMemory

GB = 1e9

# What to do when a stage of the export does not fit in this machine's memory (training's: _advice, from the
# parts of its need).
OUT_OF_MEMORY_ADVICE = {
    "BatchNorm estimation": "use fewer --calib-samples or a smaller --input-size, or give trained --weights",
    "conversion": "use a smaller --input-size or fewer --calib-samples",
    "validation": "use a smaller --input-size",
    "top-5 on the sample photos": "use a smaller --input-size",
    "layer-by-layer diagnosis": "skip it with --no-diagnosis, or use a smaller --input-size",
}

# What a stage takes beyond what the process holds before it: (bytes per
# byte of float32 weights, bytes per byte of one image's activations, bytes).
# Low ends, so that a stage is refused only when it clearly cannot fit: on
# the smallest variant of every family, mobilevit_v3_xs and vit_large16
# (benchmarks/memory.py; docs/profiling.md, Memory) conversion took 5-16
# bytes per byte of weights over what the activations explain (resmlp_12,
# 61 MB of weights: 1.06 GB; vit_large16, 1.22 GB: 19.7 GB, as the plain
# converter; mobilevit_v2_050, 6 MB of weights and 96 MB of activations:
# 0.18 GB, estimated 0.16 GB), the diagnosis (an fp32
# conversion, then both files run keeping every tensor; since, the fp32
# file's a share at a time) 0.2-0.5 GB,
# BatchNorm estimation 0.05-0.15 GB.
STAGE_NEEDS = {
    # the model traced in training mode on 2 images a pass
    "BatchNorm estimation": (0.0, 0.2, 0.02e9),
    # the traced graph, the converter's copies of the weights, the
    # calibration interpreter keeping every tensor of an image
    "conversion": (4.0, 0.4, 0.1e9),
    # the model traced on 2 images a pass, the file run by a LiteRT child
    "validation": (0.25, 0.2, 0.05e9),
    "top-5 on the sample photos": (0.25, 0.2, 0.05e9),
    "layer-by-layer diagnosis": (4.0, 0.6, 0.1e9),
    # per image of a batch; the weights with their gradients and optimizer
    # state. qat of mobilevit_v3_xxs (3 MB of weights) grew its address space
    # by 0.95 GB at 64 px and batch 8 (5 MB of activations an image in the
    # QAT model), 0.91 GB at 128 px and batch 16 (20 MB), 2.0 GB at 256 px
    # and batch 8 (80 MB), its resident memory by about as much
    "training": (4.0, 1.0, 0.55e9),
    "quantization-aware training": (4.0, 1.0, 0.55e9),
}

# What a stage takes of the address space (`ulimit -v`) where it maps more
# than it touches, measured (as STAGE_NEEDS); other stages: STAGE_NEEDS.
# Where the limit leaves less, TensorFlow crashes (SIGSEGV) instead of
# failing an allocation, so high ends here. Checked before the images load
# (the float model; calibration and validation run batches as training
# does), the address space of mobilevit_v3_xxs grew, streamed through
# tf.data (its threads' stacks and the traced steps included): finetune by
# 0.98 GB at 64 px and batch 8 (3.8 MB of activations an image), 1.09 GB at
# 128 px and batch 16 (15 MB); qat by 2.15 GB and 2.37 GB (qat at 64 px,
# batch 8 died of SIGSEGV under a limit of 4.2 GB that left it 1.8 GB).
ADDRESS_SPACE_NEEDS = {
    "training": (4.0, 1.0, 1.05e9),
    "quantization-aware training": (4.0, 1.0, 2.2e9),
}

MEMINFO = Path("/proc/meminfo")
PROCESS_STATUS = Path("/proc/self/status")
CGROUPS = Path("/proc/self/cgroup")
CGROUP_ROOT = Path("/sys/fs/cgroup")


def weight_and_activation_bytes(model) -> tuple[int, int]:
    """The model's float32 weights, and the outputs of its top-level layers
    for one image, in bytes."""
    activations = 0
    for operation in model.operations:
        try:
            outputs = operation.output if isinstance(operation.output, (list, tuple)) else [operation.output]
        except (AttributeError, ValueError):  # a layer called more than once, a subclassed model: left out
            continue
        activations += sum(int(np.prod(output.shape[1:])) for output in outputs)
    return 4 * model.count_params(), 4 * activations


def stage_need(stage: str, model, images: int = 1, needs: dict = STAGE_NEEDS, batches: dict | None = None) -> float:
    """The bytes ``stage`` is estimated to take on ``model`` (see STAGE_NEEDS,
    or ``needs``), on ``images`` images at once (a training batch)."""
    return sum(need_parts(stage, model, images, needs, batches))


def need_parts(stage: str, model, images: int = 1, needs: dict = STAGE_NEEDS,
               batches: dict | None = None) -> tuple[float, float, float]:
    """(the weights', the images', the fixed) part of what ``stage`` takes
    on ``model``. ``batches``: the images a step takes at each multi-scale
    resolution ({size: images}); the largest need of them counts (an image's
    activations grow with its pixels). Default: ``images`` at the model's size."""
    weights, activations = weight_and_activation_bytes(model)
    per_weight, per_activation, fixed = needs.get(stage, STAGE_NEEDS[stage])
    base = int(model.inputs[0].shape[1]) if batches else 0
    images_part = max(activations * (size / base) ** 2 * count for size, count in batches.items()) if batches \
        else activations * images
    return per_weight * weights, per_activation * images_part, fixed


def need_for(stage: str, weight_bytes: float, activation_bytes: float, needs: dict = STAGE_NEEDS) -> float:
    per_weight, per_activation, fixed = needs.get(stage, STAGE_NEEDS[stage])
    return per_weight * weight_bytes + per_activation * activation_bytes + fixed


def _advice(stage: str, model, images: int, batches: dict | None, room: float | None, needs: dict) -> str | None:
    """What to do about ``stage`` not fitting in ``room`` bytes (None: an
    allocation that failed while it ran): for training, the setting that
    drives its need, and only a change that can make it fit; None when
    nothing but more memory can (TensorFlow's part alone does not fit)."""
    if stage not in ("training", "quantization-aware training"):
        return OUT_OF_MEMORY_ADVICE[stage]
    weights, images_part, fixed = need_parts(stage, model, images, needs, batches)
    base = int(model.inputs[0].shape[1])
    size, count = max((batches or {base: images}).items(),
                      key=lambda item: (item[0] / base) ** 2 * item[1])  # the step that needs the most
    if room is None:
        return ("use a smaller --batch-size or --input-size" if size == base else
                f"leave {size} out of --multiscale (its steps take {count} image(s) of {size} px), or use a "
                "smaller --batch-size")
    if fixed > room:
        return None
    if weights + fixed > room:  # before any image
        return (f"before any image, {model.name}'s weights with their gradients and optimizer state take about "
                f"{weights / GB:.2f} GB and TensorFlow's part {fixed / GB:.2f} GB, whatever the batch: train a "
                "smaller model")
    if size != base:
        return (f"leave {size} out of --multiscale: its steps take {count} image(s) of {size} px, about "
                f"{images_part / GB:.2f} GB (a step's batch is scaled to the pixels of --batch-size images at "
                f"{base} px, but never below one image)")
    if weights + fixed + images_part / images > room:
        return (f"even one image a step at {size} px needs more: use a smaller --input-size, or train a smaller "
                "model")
    fitting = int((room - weights - fixed) / (images_part / images))
    return f"use a --batch-size of {fitting} or less (the images of a step take about {images_part / GB:.2f} GB)"


def _gb(*amounts: float) -> list[str]:
    """``amounts`` in GB, with as many decimals (up to 4) as it takes to tell them apart."""
    for decimals in (1, 2, 3, 4):
        shown = [f"{amount / GB:.{decimals}f}" for amount in amounts]
        if len(set(shown)) == len(shown):
            break
    return shown


def address_space_left() -> tuple[int, int] | None:
    """(the shell's limit on this process's address space, what is left of
    it), in bytes; None without a limit."""
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit == resource.RLIM_INFINITY:
        return None
    try:
        used = int(re.search(r"^VmSize:\s+(\d+) kB", PROCESS_STATUS.read_text(), re.M).group(1)) * 1024
    except (OSError, AttributeError, ValueError):  # no /proc: all of it counts as left
        used = 0
    return limit, max(limit - used, 0)


def available_memory() -> int | None:
    """Bytes this process can still take: the kernel's MemAvailable, or less
    where a cgroup (a container's, a CI job's) limits it; None when neither
    can be read."""
    candidates = [_cgroup_headroom()]
    try:
        fields = dict(line.split(":", 1) for line in MEMINFO.read_text().splitlines() if ":" in line)
        candidates.append(int(fields["MemAvailable"].split()[0]) * 1024)
    except (OSError, KeyError, ValueError):
        pass
    known = [c for c in candidates if c is not None]
    return min(known) if known else None


def _cgroup_headroom() -> int | None:
    """The smallest limit minus use (less reclaimable page cache) of this
    process's memory cgroup and its ancestors, v2 or v1; None without one."""
    try:
        lines = CGROUPS.read_text().splitlines()
    except OSError:
        return None
    headroom = None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2
            mount, files = CGROUP_ROOT, ("memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):
            mount = CGROUP_ROOT / "memory"
            files = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
        else:
            continue
        folder = mount / path.lstrip("/")
        for level in [folder, *folder.parents]:
            room = _headroom_at(level, *files)
            if room is not None:
                headroom = room if headroom is None else min(headroom, room)
            if level == mount:
                break
    return headroom


def _headroom_at(folder: Path, limit_file: str, usage_file: str, cache_field: str) -> int | None:
    try:
        limit = (folder / limit_file).read_text().strip()
        usage = int((folder / usage_file).read_text())
    except (OSError, ValueError):
        return None
    if limit == "max" or int(limit) >= 2 ** 62:  # no limit set (v1 writes a huge number)
        return None
    cache = 0
    try:
        stat = dict(line.split() for line in (folder / "memory.stat").read_text().splitlines())
        cache = int(stat.get(cache_field, 0))
    except (OSError, ValueError):
        pass
    return max(int(limit) - usage + cache, 0)


@contextmanager
def memory_of(stage: str, model, images: int = 1, batches: dict | None = None):
    """Refuse ``stage`` when its estimated need on ``model`` (on ``images``
    images at once, or ``batches``: {multi-scale size: images a step}) is
    more than the memory available, or than what the shell's address-space
    limit leaves; and a stage that runs out of memory all the same ends the
    command with one error naming it and what to do (the converter reports a
    failed allocation as a failed conversion, caused by it)."""
    import tensorflow as tf

    need, available = stage_need(stage, model, images, batches=batches), available_memory()
    address_space = address_space_left()
    fixed_part = "TensorFlow's part of the stage alone takes about {:.2f} GB, whatever the model and batch"
    if available is not None and need > available:
        need_gb, available_gb = _gb(need, available)
        advice = _advice(stage, model, images, batches, available, STAGE_NEEDS)
        raise EdgevitError(f"Not enough memory for the {stage} stage: it needs about {need_gb} GB and "
                           f"{available_gb} GB is available: " + (advice or "close other programs, or use a "
                           f"machine with more memory ({fixed_part.format(need_parts(stage, model)[2] / GB)})") + ".")
    mapped = stage_need(stage, model, images, ADDRESS_SPACE_NEEDS, batches)
    if address_space is not None and mapped > address_space[1]:
        limit, left = address_space
        left_gb, mapped_gb = _gb(left, mapped)
        advice = _advice(stage, model, images, batches, left, ADDRESS_SPACE_NEEDS)
        raise EdgevitError(f"Out of memory in the {stage} stage: this shell limits a process to {limit // 1024} "
                           f"KiB of address space (`ulimit -v`), {left_gb} GB of it is left, and the stage "
                           f"needs about {mapped_gb} GB: raise the limit (`ulimit -v unlimited`)"
                           + (f", or {advice}" if advice else
                              f" ({fixed_part.format(need_parts(stage, model, 1, ADDRESS_SPACE_NEEDS)[2] / GB)})")
                           + ".")
    out_of_memory = (MemoryError, tf.errors.ResourceExhaustedError)
    try:
        yield
    except out_of_memory + (EdgevitError,) as err:
        if isinstance(err, EdgevitError) and not isinstance(err.__cause__, out_of_memory):
            raise
        raise OutOfMemory(f"Out of memory in the {stage} stage: "
                          f"{_advice(stage, model, images, batches, None, STAGE_NEEDS)}.") from None


def release_memory() -> None:
    """Give what this process freed back to the system: C++ allocations (the
    converter's, TensorFlow's while it traces, numpy's larger arrays) stay
    with the C library's allocator otherwise, and count against this process
    while the next children run (mobilevit_v3_xs: 1.06 -> 0.85 GB resident
    after an int8 conversion, 1.09 -> 1.00 GB after validation)."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: its allocator keeps what it keeps
        ctypes.CDLL("libc.so.6").malloc_trim(0)
