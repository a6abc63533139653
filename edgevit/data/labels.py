"""Class labels that travel with exported models."""
from __future__ import annotations

from importlib import resources

from edgevit.errors import is_control


def imagenet_classes() -> list[tuple[str, str]]:
    """(WordNet id, label) of the 1000 ImageNet-1k classes, in index order."""
    text = resources.files("edgevit.data").joinpath("imagenet_classes.txt").read_text()
    return [tuple(line.split("\t", 1)) for line in text.splitlines() if line]


def coco_classes() -> list[str]:
    """The 80 COCO categories in category-id order after ``background`` (class
    0), as cvnets' COCO detectors number them (coco_base.py ``class_names``)."""
    return resources.files("edgevit.data").joinpath("coco_classes.txt").read_text().splitlines()


def default_labels(num_classes: int, task: str = "classification") -> list[str]:
    """ImageNet labels for 1000-class models, COCO's for 81-class detectors,
    ``class_<i>`` otherwise."""
    if num_classes == 1000:
        return [label for _, label in imagenet_classes()]
    if task == "detection" and num_classes == len(coco_classes()):
        return coco_classes()
    return [f"class_{i}" for i in range(num_classes)]


def label_problem(name: str) -> str | None:
    """Why ``name`` cannot be a line of a labels file (None: it can). Labels
    are UTF-8 text, one non-empty line each, read by the Android app and
    shown on terminals (where control characters would act, not print)."""
    if not name.strip() or "\n" in name or "\r" in name:
        return "labels are one non-empty line each"
    if any(map(is_control, name)):
        return "it holds control characters"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # a file name's undecodable bytes, kept by Python as lone surrogates
        return "it is not valid UTF-8 text, which labels files are"
    return None
