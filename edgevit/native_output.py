"""TensorFlow's and LiteRT's C++ code print start-up chatter (CUDA probes, CPU
feature notes, delegate INFO lines) straight to file descriptors 1 and 2, where
it would bury a command's own output and break ``--json``. This module sends
it to a temporary log instead."""
from __future__ import annotations

import os
import resource
import sys
import warnings
from contextlib import contextmanager

from edgevit.errors import EdgevitError
from edgevit.writing import temporary_folder, writing

# What TensorFlow and LiteRT need of the shell's address-space limit (`ulimit -v`) to start and run a small model:
# `edgevit info mobilevit_v3_xxs` aborted with a C++ stack and no message at 2.5 GB (a MemoryError traceback at
# 1.5 GB), and failed with std::bad_alloc or an unmappable LiteRT library up to 2.9 GB; it ran at 3.0 GB.
TENSORFLOW_ADDRESS_SPACE = 3 * 10**9


@contextmanager
def native_output_captured():
    """Redirect file descriptors 1/2 (and Python warnings) to a temporary log
    for the duration; yields the log's path, readable until the block ends."""
    sys.stdout.flush()
    sys.stderr.flush()
    with temporary_folder("edgevit-log-") as tmp:
        log_path = tmp / "native.log"
        with writing(log_path):
            log = open(log_path, "w")
        saved = os.dup(1), os.dup(2)
        with log, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            try:
                yield log_path
            finally:
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                os.close(saved[0])
                os.close(saved[1])


def import_tensorflow_quietly() -> None:
    """Import TensorFlow (and probe its devices, where the CUDA probe logs)
    with that output captured; a broken install, or an address-space limit
    it cannot start under, ends in one error line."""
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit != resource.RLIM_INFINITY and limit < TENSORFLOW_ADDRESS_SPACE:
        raise EdgevitError(f"This shell limits a process to {limit // 1024} KiB of address space (`ulimit -v`); "
                           f"TensorFlow needs at least {TENSORFLOW_ADDRESS_SPACE // 1024} KiB "
                           f"({TENSORFLOW_ADDRESS_SPACE / 1e9:.0f} GB) to start: raise it, e.g. `ulimit -v unlimited`.")
    try:
        with native_output_captured():
            import tensorflow

            tensorflow.config.list_physical_devices()
    except ImportError as err:
        raise EdgevitError(f"TensorFlow failed to import: {err}") from None
