"""Class labels that travel with exported models."""
from __future__ import annotations

from importlib import resources


def imagenet_classes() -> list[tuple[str, str]]:
    """(WordNet id, label) of the 1000 ImageNet-1k classes, in index order."""
    text = resources.files("edgevit.data").joinpath("imagenet_classes.txt").read_text()
    return [tuple(line.split("\t", 1)) for line in text.splitlines() if line]


def default_labels(num_classes: int) -> list[str]:
    """ImageNet labels for 1000-class models, ``class_<i>`` otherwise."""
    if num_classes == 1000:
        return [label for _, label in imagenet_classes()]
    return [f"class_{i}" for i in range(num_classes)]
