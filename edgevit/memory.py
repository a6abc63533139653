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

import re
import resource
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from edgevit.errors import EdgevitError, OutOfMemory

GB = 1e9

# What to do when a stage does not fit in this machine's memory.
OUT_OF_MEMORY_ADVICE = {
    "BatchNorm estimation": "use fewer --calib-samples or a smaller --input-size, or give trained --weights",
    "conversion": "use a smaller --input-size or fewer --calib-samples",
    "validation": "use a smaller --input-size",
    "top-5 on the sample photos": "use a smaller --input-size",
    "layer-by-layer diagnosis": "skip it with --no-diagnosis, or use a smaller --input-size",
    "training": "use a smaller --batch-size or --input-size",
    "quantization-aware training": "use a smaller --batch-size or --input-size",
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
# conversion, then both files run keeping every tensor) 0.2-0.5 GB,
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


def stage_need(stage: str, model, images: int = 1, needs: dict = STAGE_NEEDS) -> float:
    """The bytes ``stage`` is estimated to take on ``model`` (see STAGE_NEEDS,
    or ``needs``), on ``images`` images at once (a training batch)."""
    weights, activations = weight_and_activation_bytes(model)
    return need_for(stage, weights, activations * images, needs)


def need_for(stage: str, weight_bytes: float, activation_bytes: float, needs: dict = STAGE_NEEDS) -> float:
    per_weight, per_activation, fixed = needs.get(stage, STAGE_NEEDS[stage])
    return per_weight * weight_bytes + per_activation * activation_bytes + fixed


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
def memory_of(stage: str, model, images: int = 1):
    """Refuse ``stage`` when its estimated need on ``model`` (on ``images``
    images at once) is more than the memory available, or than what the
    shell's address-space limit leaves; and a stage that runs out of memory
    all the same ends the command with one error naming it and what to do
    (the converter reports a failed allocation as a failed conversion,
    caused by it)."""
    import tensorflow as tf

    need, available, address_space = stage_need(stage, model, images), available_memory(), address_space_left()
    if available is not None and need > available:
        raise EdgevitError(f"Not enough memory for the {stage} stage: it needs about {need / GB:.1f} GB and "
                           f"{available / GB:.1f} GB is available: {OUT_OF_MEMORY_ADVICE[stage]}.")
    mapped = stage_need(stage, model, images, ADDRESS_SPACE_NEEDS)
    if address_space is not None and mapped > address_space[1]:
        limit, left = address_space
        raise EdgevitError(f"Out of memory in the {stage} stage: this shell limits a process to {limit // 1024} "
                           f"KiB of address space (`ulimit -v`), {left / GB:.1f} GB of it is left, and the stage "
                           f"needs about {mapped / GB:.1f} GB: raise the limit (`ulimit -v unlimited`), or "
                           f"{OUT_OF_MEMORY_ADVICE[stage]}.")
    out_of_memory = (MemoryError, tf.errors.ResourceExhaustedError)
    try:
        yield
    except out_of_memory + (EdgevitError,) as err:
        if isinstance(err, EdgevitError) and not isinstance(err.__cause__, out_of_memory):
            raise
        raise OutOfMemory(f"Out of memory in the {stage} stage: {OUT_OF_MEMORY_ADVICE[stage]}.") from None
