"""The importers, by (checkpoint source, model family); each source module
registers its own when :mod:`edgevit.converters.api` loads it."""
from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Callable

import numpy as np

from .rules import Rule


@dataclass
class Importer:
    """Rules of one checkpoint source for one model family."""

    source: str
    family: str
    rules: Callable[[object], list[Rule]]  # model -> rules (may depend on depth etc.)
    reference: str = ""
    head: tuple[str, ...] = ("head.fc",)  # Keras classifier layer(s)
    notes: str = ""
    # The channel order the source's checkpoints of a model were trained on;
    # a BGR one gets its stem kernel's input channels reversed at import.
    channel_order: Callable[[object], str] = lambda model: "RGB"
    # The checkpoint's tensors as the rules name them: where one Keras weight
    # is several tensors of the source (transformers' query/key/value), fused,
    # or where several Keras weights are one tensor (cvnets' SSD heads), split.
    merged: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] = lambda tensors: tensors
    # Builder options (registry.SWITCHES) for the arithmetic the source's
    # checkpoints were trained with: the model is built with them.
    options: dict[str, object] = field(default_factory=dict)
    # The class count a head layer's checkpoint tensor holds (a detector's: its rows per anchor).
    head_classes: Callable[[np.ndarray], int] = lambda value: int(value.shape[0])


IMPORTERS: dict[tuple[str, str], Importer] = {}


def register(importer: Importer) -> Importer:
    IMPORTERS[(importer.source, importer.family)] = importer
    return importer
