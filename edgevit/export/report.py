"""The conversion report as a readable table."""
from __future__ import annotations

import sys

from edgevit.export.result import ExportResult


def _fmt_bytes(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def _fmt_tensor(t: dict) -> str:
    q = t["quantization"]
    quant = f" (scale {q['scale']:.6g}, zero point {q['zero_point']})" if q else ""
    return f"{t['dtype']} {t['shape']}{quant}"


# ExportResult.quantization_ranges -> where the file's activation ranges come from, in words
RANGES = {"calibrated": "calibrated on the calibration images",
          "trained": "trained: the QAT model's own ranges (no calibration)",
          "removed": "none: the QAT model without its fake quantization (float activations, its trained "
                     "weights), validated against it computing in float"}


# delegate key -> (row label, what its left-over ops do)
DELEGATE_ROWS = {"gpu": ("GPU delegate", "fall back to the CPU"),
                 "xnnpack": ("XNNPACK (CPU, measured here)", "run on LiteRT's builtin kernels")}


def _fmt_delegate(d: dict, falling_back: str) -> str:
    parts = "1 partition" if d["partitions"] == 1 else f"{d['partitions']} partitions"
    if not d["fallback_ops"]:
        text = f"all {d['ops']} ops delegated, {parts}"
    else:
        why = "; ".join(f"{g['op']} x{g['count']}: {g['reason']}" for g in d["fallbacks"][:4])
        text = f"{d['fallback_ops']} of {d['ops']} ops {falling_back}, {parts} ({why})"
    for g in d.get("warnings") or []:
        text += f"; warning, {g['op']} x{g['count']}: {g['reason']}"
    return text


def _agreement_rows(a: dict, probabilities: bool) -> list[tuple[str, str]]:
    """A classifier's agreement per image; a segmenter's per pixel (its
    argmax, and the cosine of each pixel's logits); a detector's per anchor
    and per image (its confident detections)."""
    if "pixels" in a:
        return [("pixel argmax agreement", f"{a['top1_agreement'] * 100:.2f}% of {a['pixels']:,} pixels "
                                           f"({a['samples']} images, at the output stride)"),
                ("pixel logit cosine", f"mean {a['cosine_mean']:.5f}, min {a['cosine_min']:.5f}")]
    if "anchors" in a:  # a detector's, anchor by anchor and image by image
        return [("anchors' top class", f"{a['top1_agreement'] * 100:.1f}% of {a['samples'] * a['anchors']:,} anchors "
                                       f"({a['samples']} images)"),
                ("score cosine", f"mean {a['cosine_mean']:.5f}, min {a['cosine_min']:.5f}"),
                ("box regression cosine", f"mean {a['box_cosine_mean']:.5f}, min {a['box_cosine_min']:.5f}"),
                ("same detections", f"{a['detections_same'] * 100:.0f}% of images (scores >= {a['detection_score']}: "
                                    f"{a['detections'][0]} by Keras, {a['detections'][1]} by the file)"),
                ("max abs error", f"scores {a['max_abs_score_error']:.4g}, box regressions "
                                  f"{a['max_abs_box_error']:.4g}")]
    return [("top-1 agreement" + (" (logits)" if probabilities else ""),
             f"{a['top1_agreement'] * 100:.1f}% of {a['samples']} images"),
            ("top-5 overlap", f"{a['top5_overlap'] * 100:.1f}%"),
            ("logit cosine", f"mean {a['cosine_mean']:.5f}, min {a['cosine_min']:.5f}")]


def print_report(result: ExportResult, stream=None) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(file=stream or sys.stdout, width=110)
    a = result.agreement
    summary = Table(title=f"{result.model} -> {result.files.model}", title_justify="left",
                    show_header=False)
    summary.add_column("field", style="bold")
    summary.add_column("value", overflow="fold")
    rows = [
        ("precision", result.precision),
        ("input size", f"{result.input_size}x{result.input_size}"),
        ("weights", result.weights),
        ("file size", _fmt_bytes(result.size_bytes)),
        ("input", _fmt_tensor(result.io["input"]) + ("; the camera's RGB bytes, normalised inside the file"
                                                     if result.io["input"]["dtype"] == "uint8" else "")),
        ("output", _fmt_tensor(result.io["output"])),
        ("ops / MACs", f"{result.ops} ops, {result.macs / 1e6:.1f} M MACs"),
        ("op histogram", ", ".join(f"{k} {v}" for k, v in result.op_histogram.items())),
        ("max tensor rank", result.max_rank),
        ("quantization ranges", RANGES.get(result.quantization_ranges, "none (float activations)")),
        ("calibration images", result.images.calibration or "none"),
        ("validation images", result.images.validation),
        *_agreement_rows(a, bool(result.probability_agreement)),
        *([] if "anchors" in a else [  # a detector's errors are among its agreement rows
            ("max abs logit error", f"{a['max_abs_logit_error']:.4g} (logits span "
                                    f"{a['reference_logit_range'][0]:.3g} .. {a['reference_logit_range'][1]:.3g})")]),
        *_probability_rows(result.probability_agreement),
        ("time", f"convert {round(result.convert_seconds, 2)} s, validate {round(result.validate_seconds, 2)} s"),
    ]
    broken = result.first_breaking_layer
    if broken:
        rows.append(("first layer below cosine " + str(broken["threshold"]),
                     f"{broken['layer']} (cosine {broken['cosine']:.4f}, worst token "
                     f"{broken['worst_token_cosine']:.4f}); {broken['hint']}"))
    for name, d in (result.delegates or {}).items():
        label, falling_back = DELEGATE_ROWS.get(
            name, (f"NNAPI delegate (Android API {d.get('android_api')})", "fall back to the CPU"))
        rows.append((label, _fmt_delegate(d, falling_back)))
    if result.gpu_run is not None:
        rows.append(("GPU accelerator run", result.gpu_run.summary()))
    if result.arm_run is not None:
        rows.append(("Arm64 kernels (emulated)", result.arm_run.summary()))
    for key, value in rows:
        summary.add_row(key, str(value))
    console.print(summary)

    checks = Table(title="checks", title_justify="left")
    for col in ("check", "result", "detail"):
        checks.add_column(col, overflow="fold")
    for c in result.checks:
        checks.add_row(c.name, "[green]pass[/green]" if c.passed else "[red]FAIL[/red]", c.detail)
    console.print(checks)
    if result.top5_photos:
        photos = Table(title="top-5 on sample photos: Keras model | file", title_justify="left")
        for col in ("photo", "Keras model", "file"):
            photos.add_column(col, overflow="fold")
        for row in result.top5_photos:
            photos.add_row(row["photo"], _fmt_top5(row["keras"]), _fmt_top5(row["file"]))
        console.print(photos)
    console.print("files: " + ", ".join(str(path) for path in result.files.all()))
    if result.weights_hint:
        console.print(result.weights_hint)
    if result.verdict is not None:
        for label, text in (("why", result.verdict.why), ("next", result.verdict.next)):
            console.print(Text(f"{label}: {text}."))
        console.print(Text(result.verdict.text, style="bold"))


def _probability_rows(p: dict | None) -> list[tuple[str, str]]:
    """The rows of a file that outputs probabilities: what it outputs, and
    how its top-1 and probabilities follow the Keras model's softmax."""
    if p is None:
        return [("outputs", "logits (no softmax in the file: --logits)")]
    keras_top, file_top = p["top1_probability_mean"]
    if p["top1_ties"] * 2 >= p["samples"]:
        top1 = (f"undecided on {p['top1_ties']} of {p['samples']} images: their highest probabilities tie at the "
                f"file's resolution (1/256; the Keras model's top-1 is {keras_top:.3f} on average), so the "
                "logit rows above decide")
    else:
        ties = f", {p['top1_ties']} of them ties at the file's resolution" if p["top1_ties"] else ""
        top1 = f"{p['top1_agreement'] * 100:.1f}% of {p['samples']} images{ties}"
    return [
        ("outputs", "probabilities (softmax in the file); the logit rows above compare its softmax's input"),
        ("top-1 agreement (probabilities)", top1),
        ("max abs probability error", f"{p['max_abs_probability_error']:.4f} (mean top-1 probability: Keras "
                                      f"{keras_top:.3f}, file {file_top:.3f})"),
    ]


def _fmt_top5(top5: list) -> str:
    return "\n".join(f"{label} {prob * 100:.1f}%" for label, prob in top5)
