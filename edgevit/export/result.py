"""What `export()` returns: the facts of one conversion, typed, and the JSON
report made from them (`edgevit convert --json` and the NAME.report.json
sidecar)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from edgevit.litert.accelerator import GpuRun
from edgevit.litert.arm import ArmCheck

if TYPE_CHECKING:
    from edgevit.export.verdict import Verdict


@dataclass
class Check:
    """One deployment rule the converted file was held to; ``place``: the
    place a run checked (the GPU, Arm64), which a failure rules out alone
    (None: a rule of the file itself, which a failure makes not deployable)."""
    name: str
    passed: bool
    detail: str
    place: str | None = None

    def to_dict(self) -> dict:
        return {"check": self.name, "passed": self.passed, "detail": self.detail, "place": self.place}


@dataclass
class ImageSources:
    """Where the calibration (None when the precision needs none) and the
    validation images came from, in words."""
    calibration: str | None
    validation: str

    def to_dict(self) -> dict:
        return {"calibration": self.calibration, "validation": self.validation}


@dataclass
class ExportFiles:
    model: Path
    metadata: Path
    labels: Path
    report: Path

    @classmethod
    def beside(cls, model: Path) -> ExportFiles:
        """NAME.tflite with NAME.json, NAME.labels.txt and NAME.report.json next to it."""
        stem = model.with_suffix("")
        return cls(model=model, metadata=stem.with_name(stem.name + ".json"),
                   labels=stem.with_name(stem.name + ".labels.txt"),
                   report=stem.with_name(stem.name + ".report.json"))

    def all(self) -> list[Path]:
        return [self.model, self.metadata, self.labels, self.report]

    def to_dict(self) -> dict:
        return {"model": str(self.model), "metadata": str(self.metadata), "labels": str(self.labels),
                "report": str(self.report)}


@dataclass
class ExportResult:
    model: str
    precision: str
    input_size: int
    weights: str                    # where the weights came from (a file, or "random-init")
    files: ExportFiles
    size_bytes: int
    io: dict                        # {"input": tensor, "output": tensor}: shape, dtype, quantization
    op_histogram: dict[str, int]
    macs: int
    max_rank: int
    checks: list[Check]
    delegates: dict                 # what the GPU / NNAPI delegates (rules) and XNNPACK (measured) leave on the CPU
    images: ImageSources
    # the LiteRT file against the Keras model on logits (edgevit.litert.agreement); for a file
    # that outputs probabilities, on its softmax's input
    agreement: dict
    convert_seconds: float
    validate_seconds: float
    # Set when agreement was low enough to compare layer by layer; the layer
    # may still be None when no single layer falls below the threshold.
    diagnosed: bool = False
    first_breaking_layer: dict | None = None
    gpu_run: GpuRun | None = None   # None: not asked for (ExportOptions.gpu_images = 0)
    # Per sample photo, the Keras model's and the file's top-5 [label, probability]
    # (None: not asked for, ExportOptions.show_top5_photos)
    top5_photos: list[dict] | None = None
    weights_hint: str | None = None  # how to get trained weights, for a random-init model
    arm_run: ArmCheck | None = None  # None: not asked for (ExportOptions.arm_images = 0)
    # "calibrated", "trained" (QAT), "removed" (a float file of a QAT model), None (a float file)
    quantization_ranges: str | None = None
    # a file of probabilities against the Keras model's softmax (agreement.probability_agreement)
    probability_agreement: dict | None = None
    verdict: Verdict | None = None  # set last, from everything above (edgevit.export.verdict)

    @property
    def ops(self) -> int:
        return sum(self.op_histogram.values())

    def to_dict(self) -> dict:
        report = {
            "model": self.model,
            "precision": self.precision,
            "quantization_ranges": self.quantization_ranges,
            "input_size": self.input_size,
            "weights": self.weights,
            "file": str(self.files.model),
            "size_bytes": self.size_bytes,
            "io": self.io,
            "ops": self.ops,
            "macs": self.macs,
            "op_histogram": self.op_histogram,
            "max_rank": self.max_rank,
            "checks": [c.to_dict() for c in self.checks],
            "delegates": self.delegates,
            "images": self.images.to_dict(),
            "outputs": "probabilities" if self.probability_agreement is not None else "logits",
            "agreement": self.agreement,
            **({"probability_agreement": self.probability_agreement} if self.probability_agreement else {}),
            "seconds": {"convert": round(self.convert_seconds, 2), "validate": round(self.validate_seconds, 2)},
            "files": self.files.to_dict(),
        }
        if self.diagnosed:
            report["first_breaking_layer"] = self.first_breaking_layer
        if self.gpu_run is not None:
            report["gpu_accelerator"] = self.gpu_run.to_dict()
        if self.top5_photos is not None:
            report["top5_photos"] = self.top5_photos
        if self.weights_hint:
            report["weights_hint"] = self.weights_hint
        if self.arm_run is not None:
            report["arm64"] = self.arm_run.to_dict()
        if self.verdict is not None:
            report["verdict"] = self.verdict.to_dict()
        return report
