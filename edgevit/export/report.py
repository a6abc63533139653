"""The conversion report as a readable table."""
from __future__ import annotations

import sys


def _fmt_bytes(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def _fmt_tensor(t: dict) -> str:
    q = t["quantization"]
    quant = f" (scale {q['scale']:.6g}, zero point {q['zero_point']})" if q else ""
    return f"{t['dtype']} {t['shape']}{quant}"


def _fmt_delegate(d: dict) -> str:
    parts = "1 partition" if d["partitions"] == 1 else f"{d['partitions']} partitions"
    if not d["fallback_ops"]:
        text = f"all {d['ops']} ops delegated, {parts}"
    else:
        why = "; ".join(f"{g['op']} x{g['count']}: {g['reason']}" for g in d["fallbacks"][:4])
        text = f"{d['fallback_ops']} of {d['ops']} ops fall back to the CPU, {parts} ({why})"
    for g in d.get("warnings") or []:
        text += f"; warning, {g['op']} x{g['count']}: {g['reason']}"
    return text


def print_report(report: dict, stream=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(file=stream or sys.stdout, width=110)
    a = report["agreement"]
    summary = Table(title=f"{report['model']} -> {report['file']}", title_justify="left",
                    show_header=False)
    summary.add_column("field", style="bold")
    summary.add_column("value", overflow="fold")
    rows = [
        ("precision", report["precision"]),
        ("input size", f"{report['input_size']}x{report['input_size']}"),
        ("weights", report["weights"]),
        ("file size", _fmt_bytes(report["size_bytes"])),
        ("input", _fmt_tensor(report["io"]["input"])),
        ("output", _fmt_tensor(report["io"]["output"])),
        ("ops / MACs", f"{report['ops']} ops, {report['macs'] / 1e6:.1f} M MACs"),
        ("op histogram", ", ".join(f"{k} {v}" for k, v in report["op_histogram"].items())),
        ("max tensor rank", report["max_rank"]),
        ("calibration images", report["images"]["calibration"] or "not needed"),
        ("validation images", report["images"]["validation"]),
        ("top-1 agreement", f"{a['top1_agreement'] * 100:.1f}% of {a['samples']} images"),
        ("top-5 overlap", f"{a['top5_overlap'] * 100:.1f}%"),
        ("logit cosine", f"mean {a['cosine_mean']:.5f}, min {a['cosine_min']:.5f}"),
        ("max abs logit error", f"{a['max_abs_logit_error']:.4g} (logits span "
                                f"{a['reference_logit_range'][0]:.3g} .. {a['reference_logit_range'][1]:.3g})"),
        ("time", f"convert {report['seconds']['convert']} s, validate {report['seconds']['validate']} s"),
    ]
    broken = report.get("first_breaking_layer")
    if broken:
        rows.append(("first layer below cosine " + str(broken["threshold"]),
                     f"{broken['layer']} (cosine {broken['cosine']:.4f}, worst token "
                     f"{broken['worst_token_cosine']:.4f}); {broken['hint']}"))
    for name, d in (report.get("delegates") or {}).items():
        label = "GPU delegate" if name == "gpu" else f"NNAPI delegate (Android API {d.get('android_api')})"
        rows.append((label, _fmt_delegate(d)))
    for key, value in rows:
        summary.add_row(key, str(value))
    console.print(summary)

    checks = Table(title="checks", title_justify="left")
    for col in ("check", "result", "detail"):
        checks.add_column(col, overflow="fold")
    for c in report["checks"]:
        checks.add_row(c["check"], "[green]pass[/green]" if c["passed"] else "[red]FAIL[/red]", c["detail"])
    console.print(checks)
    console.print("files: " + ", ".join(report["files"].values()))
