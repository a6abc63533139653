"""The line a conversion report ends with: where the file can be deployed,
whether it computes what the Keras model computes, and what to do next.

Made from the facts of an :class:`edgevit.export.result.ExportResult`, so
the table (`edgevit convert`) and the JSON (``verdict``) say the same.
"""
from __future__ import annotations

from dataclasses import dataclass

from edgevit.errors import shell_word
from edgevit.litert.detection_postprocess import POSTPROCESS_OP
from edgevit.pretrained import RANDOM_INIT

# Precisions whose files GPU delegates run entirely (dynamic-range and int16
# kernels stay on the CPU).
GPU_PRECISIONS = ("fp32", "fp16", "int8", "int8_mixed")

# Agreement with the Keras model on the held-out images (logits): "good" keeps
# the model's answers, "fair" changes a few, "poor" changes many.
GOOD = {"top1_agreement": 0.95, "cosine_mean": 0.99}
FAIR = {"top1_agreement": 0.85, "cosine_mean": 0.97}


@dataclass
class Verdict:
    deployable_on: list[str]    # "CPU (XNNPACK)", "GPU delegate", "NNAPI", "Arm64": what nothing argues against
    agreement: str              # "good", "fair" or "poor"
    text: str                   # the one line the report ends with, within 80 columns
    why: str = ""               # the evidence behind it: where, why not elsewhere, the agreement measured
    next: str = ""              # what to do next

    def to_dict(self) -> dict:
        return {"deployable_on": self.deployable_on, "agreement": self.agreement, "text": self.text,
                "why": self.why, "next": self.next}


@dataclass(frozen=True)
class Place:
    """A place a file can run: its short name (the verdict line, a check's
    ``place``) and how the report names it."""
    short: str
    name: str


def agreement_level(agreement: dict) -> str:
    for level, floor in (("good", GOOD), ("fair", FAIR)):
        if all(agreement[key] >= value for key, value in floor.items()):
            return level
    return "poor"


def verdict(result) -> Verdict:
    """The verdict on ``result`` (an ExportResult). A failed check of the
    file itself (its graph) makes it not deployable; a failed check of one
    place (a GPU or Arm64 run, ``Check.place``) rules out that place only."""
    failed = [c for c in result.checks if not c.passed and c.place is None]
    places, doubts = _places(result)
    for check in (c for c in result.checks if not c.passed and c.place is not None):
        if any(place.short == check.place for place in places):
            places = [place for place in places if place.short != check.place]
            doubts.append((check.place, f"{check.name} failed ({check.detail})"))
    a = result.agreement
    level = agreement_level(a)
    segmenter = "pixels" in a  # agreement measured per pixel
    measured = (f"pixel argmax {a['top1_agreement'] * 100:.1f}%, pixel logit cosine {a['cosine_mean']:.4f} on "
                f"{a['samples']} images" if segmenter else
                f"anchors' top class {a['top1_agreement'] * 100:.1f}%, score cosine {a['cosine_mean']:.4f}, box "
                f"cosine {a['box_cosine_mean']:.4f}, the same detections on {a['detections_same'] * 100:.0f}% of "
                f"{a['samples']} images" if "anchors" in a else
                f"top-1 {a['top1_agreement'] * 100:.1f}%, logit cosine {a['cosine_mean']:.4f} on {a['samples']} images")
    random_weights = result.weights == RANDOM_INIT
    model = shell_word(result.files.model)
    if failed:
        where = f"not deployable as it is: {len(failed)} check(s) failed ({failed[0].name}: {failed[0].detail})"
        line = f"not deployable ({len(failed)} check{'s' if len(failed) > 1 else ''} failed)"
        places = []
    else:
        where = "deployable on " + _joined([place.name for place in places]) + "".join(f"; {d}" for _, d in doubts)
        avoided = [short for short, _ in doubts if short]
        line = "deploy on " + ", ".join(place.short for place in places) + \
            (f" (not {', '.join(avoided)})" if avoided else "")
    if level == "good":
        why = f"agreement with the Keras model good ({measured})"
        if random_weights:
            why += " (random weights: convert pretrained or fine-tuned ones to judge the real model)"
        nxt = (f"`edgevit eval {model} --data DIR` for its mIoU on your segmentation folder; MediaPipe's "
               "ImageSegmenter loads it as it is" if segmenter else
               f"`edgevit eval {model} --data DIR` for its mAP on your detection folder; MediaPipe's "
               "ObjectDetector loads it as it is" if "anchors" in a else
               f"`edgevit eval {model} --data DIR` for its accuracy on your images, then "
               f"`edgevit bundle {model} --android-demo android_demo` to try it on a phone")
    elif random_weights:
        why = (f"agreement {level} ({measured}), as expected with random weights: their logits lie close "
               "together, so int8's rounding reorders them; this says nothing about trained weights")
        nxt = ("convert pretrained weights (--weights imagenet, where the model has them) or a fine-tuned "
               "model (`edgevit finetune`) and judge that file")
    else:
        broken = result.first_breaking_layer
        where_it_breaks = f", first below cosine {broken['threshold']} at {broken['layer']}" if broken else ""
        why = f"agreement {level} ({measured}{where_it_breaks})"
        nxt = broken["hint"] if broken else _lossless_advice(result)
        if level == "fair":
            nxt += f"; or check that the accuracy it keeps is enough: `edgevit eval {model} --data DIR`"
    nxt += "".join(f"; {advice}" for advice in _advice_for(dict(doubts), result) if not failed)
    if failed:
        nxt = "fix the failed check(s) above"
    line = f"verdict: {line}; agreement {level}" + (": random weights" if random_weights and level != "good" else "")
    return Verdict([place.name for place in places], level, line, f"{where}; {why}", nxt)


def _places(result) -> tuple[list[Place], list[tuple[str | None, str]]]:
    """Where the file runs as it should, and what argues against a place
    (the place's short name, or None for a note that rules out none)."""
    places, doubts = [Place("CPU", "CPU (XNNPACK)")], []
    gpu, nnapi = result.delegates.get("gpu"), result.delegates.get("nnapi")
    run = result.gpu_run
    if result.precision in GPU_PRECISIONS and gpu is not None:
        fallbacks, tail = _fallbacks(gpu)
        if run is not None and run.ran and not run.agrees:
            doubts.append(("GPU", "the GPU accelerator gave another answer than XNNPACK: not the GPU delegate"))
        elif fallbacks:
            doubts.append(("GPU", f"GPU delegate with {fallbacks} of {gpu['ops']} ops on the CPU"))
        else:
            places.append(Place("GPU", "GPU delegate" + (" (run here: same answer)" if run is not None and run.ran
                                                         else " (by its rules; not run here)") + tail))
    if nnapi is not None:
        fallbacks, tail = _fallbacks(nnapi)
        if fallbacks:
            doubts.append(("NNAPI", f"NNAPI with {fallbacks} of {nnapi['ops']} ops on the CPU"))
        else:
            places.append(Place("NNAPI", f"NNAPI (Android API {nnapi.get('android_api')} rules)" + tail))
    arm = result.arm_run
    if arm is not None and arm.ran:
        if arm.agrees:
            places.append(Place("Arm64", "Arm64 (its kernels, emulated: same answer)"))
        else:
            doubts.append(("Arm64", "Arm64's kernels gave another answer than x86 (emulated): check it on a phone"))
    x86 = (result.delegates.get("xnnpack") or {}).get("warnings") or []
    if x86:
        doubts.append((None, "; ".join(f"{w['op']} x{w['count']}: {w['reason']}" for w in x86)))
    return places, doubts


def _fallbacks(report: dict) -> tuple[int, str]:
    """(the ops a delegate leaves on the CPU but a detector's post-processing
    op, what the place's name adds): the op runs on the CPU after the
    delegated graph on every delegate, as its clients expect."""
    postprocessing = sum(f["count"] for f in report["fallbacks"] if f["op"] == POSTPROCESS_OP)
    return report["fallback_ops"] - postprocessing, " (its detection post-processing on the CPU)" if postprocessing \
        else ""


def _advice_for(ruled_out: dict, result) -> list[str]:
    """What to do about each place a doubt rules out."""
    advice = []
    if "GPU" in ruled_out:
        advice.append("ship it without the GPU delegate (CPU or NNAPI), or convert --fp16 for the GPU, which "
                      "computes in float" + ("" if result.precision == "int8_mixed" else ", or --int8-mixed"))
    if "NNAPI" in ruled_out:
        advice.append("on NNAPI its left-over ops run on the CPU: check the latency on a phone "
                      "(`edgevit bench --device SERIAL --delegate nnapi`)")
    if "Arm64" in ruled_out:
        advice.append("check its answers on a phone before you ship it")
    return advice


def _lossless_advice(result) -> str:
    """What to try when a file of trained weights agrees poorly and no layer
    was named (the diagnosis covers calibrated files only, and may find none)."""
    if result.quantization_ranges == "trained":
        return "train the QAT model longer, or on more images"
    return {"int8": "calibrate on images like the ones it will see (--calib DIR), keep the worst layers in float "
                    "(--int8-mixed), or train the ranges (`edgevit qat`)",
            "int8_mixed": "calibrate on images like the ones it will see (--calib DIR), or train the ranges "
                          "(`edgevit qat`)",
            "int16x8": "try --int8-mixed or --fp16",
            "dynamic": "try --fp16",
            "fp16": "try --fp32 (half precision loses what this model needs)"}.get(
        result.precision, "a float file should agree: report it with the model and the command")


def _joined(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
