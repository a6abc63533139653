"""Where scripts/install-arm-emulator.sh installs the emulators (qemu for
Arm64 and for older x86 CPUs, the Arm64 Python and LiteRT), and what to say
when they are not there. Its own module so that the Arm64 and x86 runs,
and running a file under either, import it without importing each other."""
from __future__ import annotations

import os
from pathlib import Path

HOME_ENV = "EDGEVIT_ARM_HOME"
HOW_TO_INSTALL = ("install it with `bash scripts/install-arm-emulator.sh` from the edgevit repository "
                  "(about 2 minutes, 140 MB under ~/.cache/edgevit-arm)")


def arm_home() -> Path:
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".cache" / "edgevit-arm")
