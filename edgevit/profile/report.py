"""`edgevit bench` / `edgevit check` results as tables, CSV and PNG plots."""
from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

from edgevit.errors import EdgevitError

CSV_FIELDS = ["model", "file", "precision", "target", "device", "runtime", "delegate", "threads", "status",
              "runs", "init_ms", "first_ms", "warmup_avg_ms", "p50_ms", "p90_ms", "p99_ms", "avg_ms", "std_ms",
              "min_ms", "max_ms", "p5_ms", "p95_ms", "peak_mem_mb", "mem_delta_mb", "delegated_nodes",
              "total_nodes", "delegate_kernels", "error"]


def _ms(v) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" if v < 1 else (f"{v:.2f}" if v < 100 else f"{v:.0f}")


def _mb(v) -> str:
    return "-" if v is None else f"{v:.0f}"


def config_label(row: dict) -> str:
    """'xnnpack x2', 'reference', 'benchmark_model cpu x4', 'gpu', 'nnapi'."""
    delegate = row.get("delegate") or "?"
    label = f"benchmark_model {delegate}" if row.get("runtime") == "benchmark_model" and row.get("target") == "host" \
        else delegate
    if row.get("threads") and delegate not in ("reference", "gpu", "nnapi"):
        label += f" x{row['threads']}"
    return label


def latency(row: dict) -> float | None:
    """The headline number: median, else the mean."""
    return row.get("p50_ms") if row.get("p50_ms") is not None else row.get("avg_ms")


def table_rows(result: dict) -> tuple[list[str], list[list[str]]]:
    columns = ["model", "precision", "where", "delegate", "status", "init ms", "first ms", "p50 ms", "p90 ms",
               "p99 ms", "avg ms (std)", "peak MB", "on delegate"]
    rows = []
    for r in result["results"]:
        parts = []
        if r.get("delegated_nodes") is not None and r.get("delegate") in ("gpu", "nnapi"):
            kernels = r.get("delegate_kernels")
            parts.append(f"{r['delegated_nodes']}/{r['total_nodes']} ops"
                         + (f", {kernels} kernel" + ("s" if kernels > 1 else "") if kernels else ""))
        if r.get("expected_fallback_ops") is not None:
            n = r["expected_fallback_ops"]
            parts.append(f"check: {n} CPU op" + ("s" if n != 1 else ""))
        delegated = "; ".join(parts) or "-"
        status = r.get("status", "?")
        if status != "ok" and r.get("error"):
            status = f"{status}: {r['error']}"
        avg = "-" if r.get("avg_ms") is None else \
            f"{_ms(r['avg_ms'])}" + (f" ({_ms(r['std_ms'])})" if r.get("std_ms") is not None else "")
        rows.append([r.get("model", "-"), r.get("precision", "-"), r.get("device") or r.get("target", "-"),
                     config_label(r), status, _ms(r.get("init_ms")), _ms(r.get("first_ms")), _ms(r.get("p50_ms")),
                     _ms(r.get("p90_ms")), _ms(r.get("p99_ms")), avg, _mb(r.get("peak_mem_mb")), delegated])
    return columns, rows


def print_bench(result: dict, stream=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(file=stream or sys.stdout, width=160)
    for d in result.get("devices") or []:
        from edgevit.profile.adb import thermal_label

        console.print(f"[bold]{d['serial']}[/bold]: {d['model']}, SoC {d['soc']} (board {d['board']}), "
                      f"Android {d['android']} (API {d['sdk']}), {d['abi']}, thermal {thermal_label(d['thermal'])}"
                      + (f" -> {thermal_label(d['thermal_after'])} after the runs" if d.get("thermal_after") else ""))
    if result.get("host"):
        console.print(f"[bold]host[/bold]: {result['host']['model']}")
    columns, rows = table_rows(result)
    table = Table(title="latency (ms) per inference, batch 1", title_justify="left")
    for col in columns:
        table.add_column(col, overflow="fold", justify="right" if "ms" in col or "MB" in col else "left")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    for r in result["results"]:
        if r.get("op_profile"):
            top = ", ".join(f"{o['node_type']} {o['percent']:.0f}%" for o in r["op_profile"][:5]
                            if o.get("percent") is not None)
            console.print(f"  top ops, {r.get('model')} {r.get('device') or r.get('target')} "
                          f"{config_label(r)}: {top}")


def write_csv(result: dict, path: str | Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for r in result["results"]:
            writer.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in CSV_FIELDS})


def load_eval(paths) -> dict[str, float]:
    """Accuracy (%) per model file from JSON files: `edgevit eval --json`
    reports ({"file": ..., "top1": ...}), lists of them, or a mapping
    {"a_int8.tflite": 0.71 | {"top1": 0.71}, ...}."""
    out: dict[str, float] = {}
    for path in ([paths] if isinstance(paths, (str, Path)) else paths):
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise EdgevitError(f"Eval results file {str(path)!r} does not exist.") from None
        except (OSError, ValueError) as err:
            raise EdgevitError(f"Cannot read eval results {str(path)!r}: {err}.") from None
        if isinstance(data, dict) and "top1" in data and ("file" in data or "model" in data):
            data = [data]  # one `edgevit eval --json` report
        if isinstance(data, dict):
            items = list(data.items())
        elif isinstance(data, list):
            items = [(Path(d["file"]).name if d.get("file") else d.get("model"), d)
                     for d in data if isinstance(d, dict)]
        else:
            items = []
        for key, value in items:
            if isinstance(value, dict):
                value = next((value[k] for k in ("top1", "top1_accuracy", "accuracy", "acc") if k in value), None)
            if key is not None and isinstance(value, (int, float)):
                out[str(key)] = float(value) * (100.0 if value <= 1.0 else 1.0)
        if not items or not out:
            raise EdgevitError(f"No accuracy values found in {str(path)!r} (expected `edgevit eval --json` output "
                               'or {"model_int8.tflite": {"top1": 0.71}}).')
    return out


def _accuracy_for(row: dict, accuracies: dict[str, float]) -> float | None:
    file = row.get("file", "")
    for key in (file, Path(file).stem, row.get("model"), row.get("precision")):
        if key in accuracies:
            return accuracies[key]
    return None


def plot(result: dict, path: str | Path, accuracies: dict[str, float] | None = None) -> None:
    """Median latency by (where, delegate) x precision as grouped bars (whisker
    to p90/p95 where known); an accuracy-vs-latency scatter when given."""
    matplotlib = require_matplotlib()
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in result["results"] if r.get("status") == "ok" and latency(r) is not None]
    if not ok:
        raise EdgevitError("Nothing to plot: no configuration produced timings.")
    multi_model = len({r["model"] for r in ok}) > 1

    def series_of(r):
        return f"{r['model']} {r['precision']}" if multi_model else r["precision"]

    def config_of(r):
        return f"{r.get('device') or r['target']}\n{config_label(r)}"

    configs = list(dict.fromkeys(config_of(r) for r in ok))
    series = list(dict.fromkeys(series_of(r) for r in ok))
    panels = 2 if accuracies else 1
    fig, axes = plt.subplots(1, panels, figsize=(max(7.0, 0.9 * len(configs) * len(series) + 3) +
                                                 (6 if accuracies else 0), 5), squeeze=False)
    ax = axes[0][0]
    width = 0.8 / len(series)
    for si, name in enumerate(series):
        xs, ys, hi = [], [], []
        for ci, cfg in enumerate(configs):
            for r in ok:
                if series_of(r) == name and config_of(r) == cfg:
                    xs.append(ci + si * width)
                    ys.append(latency(r))
                    upper = r.get("p90_ms") if r.get("p90_ms") is not None else r.get("p95_ms")
                    hi.append(max(0.0, (upper or latency(r)) - latency(r)))
        bars = ax.bar(xs, ys, width, label=name, yerr=[[0] * len(hi), hi], capsize=3)
        ax.bar_label(bars, fmt="%.1f", fontsize=7)
    ax.set_xticks([i + width * (len(series) - 1) / 2 for i in range(len(configs))], configs, fontsize=8)
    values = [latency(r) for r in ok]
    if min(values) > 0 and max(values) / min(values) > 10:
        from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_ylabel("median latency per inference (ms)")
    ax.set_title("latency by device/delegate x precision (whisker: p90 or p95)")
    ax.legend(fontsize=8)
    if accuracies:
        ax2 = axes[0][1]
        for cfg in configs:
            pts = [(latency(r), _accuracy_for(r, accuracies), r) for r in ok if config_of(r) == cfg]
            pts = [p for p in pts if p[1] is not None]
            if pts:
                ax2.scatter([p[0] for p in pts], [p[1] for p in pts], label=cfg.replace("\n", " "))
                for x, y, r in pts:
                    ax2.annotate(r["precision"], (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax2.set_xlabel("median latency (ms)")
        ax2.set_ylabel("top-1 accuracy (%)")
        ax2.set_title("accuracy vs latency")
        ax2.legend(fontsize=7)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120, format="png")
    finally:
        plt.close(fig)


def require_matplotlib():
    try:
        import matplotlib
    except ImportError:
        raise EdgevitError("--plot needs matplotlib: `pip install matplotlib`.") from None
    return matplotlib


def _sizes(sizes: list[int], shown: int = 6) -> str:
    top = sorted(sizes, reverse=True)
    return ", ".join(map(str, top[:shown])) + (" ..." if len(top) > shown else "")


def print_check(model: str, reports: dict, gpu_run=None, stream=None) -> None:
    """The rule tables' findings per delegate and, after the GPU's, the GPU
    accelerator run (``edgevit.litert.accelerator.GpuRun``) when one was asked for."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(file=stream or sys.stdout, width=140)
    for name, r in reports.items():
        label = "GPU delegate" if name == "gpu" else f"NNAPI delegate (Android API {r.android_api})"
        verdict = "[green]all ops delegated[/green]" if not r.fallbacks else \
            f"[red]{len(r.fallbacks)} of {r.ops} ops fall back to the CPU[/red]"
        console.print(f"[bold]{label}[/bold] - {model}: {verdict}; {r.supported_ops}/{r.ops} ops in "
                      f"{r.partitions} delegate partition{'s' if r.partitions != 1 else ''}"
                      + (f" (largest {_sizes(r.partition_sizes)}; with default options the delegate "
                         f"takes {r.ops_on_delegate_by_default} ops)" if r.partitions > 1 else ""))
        if r.fallbacks:
            from edgevit.litert.delegates import fallback_summary

            table = Table(show_header=True)
            for col in ("op", "count", "why it stays on the CPU", "op indices"):
                table.add_column(col, overflow="fold")
            for g in fallback_summary(r.fallbacks):
                idx = ", ".join(map(str, g["op_indices"][:8])) + (" ..." if len(g["op_indices"]) > 8 else "")
                table.add_row(g["op"], str(g["count"]), escape(g["reason"]), idx)
            console.print(table)
        if r.warnings:
            from edgevit.litert.delegates import fallback_summary

            for g in fallback_summary(r.warnings):
                console.print(f"  [yellow]warning[/yellow]: {g['op']} x{g['count']} (ops "
                              f"{', '.join(map(str, g['op_indices'][:6]))}{' ...' if g['count'] > 6 else ''}): "
                              f"{escape(g['reason'])}")
        if r.note:
            console.print(f"  note: {r.note}")
        if name == "gpu" and gpu_run is not None:
            colour = "green" if gpu_run.ran and gpu_run.fully_accelerated and gpu_run.agrees else \
                "yellow" if not gpu_run.ran else "red"
            console.print(f"[bold]LiteRT GPU accelerator run[/bold] - {model}: [{colour}]{escape(gpu_run.summary())}"
                          f"[/{colour}]" + (f"; inputs: {gpu_run.images}" if gpu_run.ran else ""))
