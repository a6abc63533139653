"""What `edgevit bench` and `edgevit check` print and write: console tables,
CSV files and PNG plots. Measuring is elsewhere (``bench``, ``adb``,
``host``, ``arm`` in this package; the rule tables and runs in
``edgevit.litert``); this module only presents results.

- Latency runs (`bench` on the host or a phone): :func:`print_bench`,
  :func:`write_csv`, :func:`plot` (latency against the accuracy that
  :func:`load_eval` reads from `edgevit eval --json` files).
- Arm64 instruction counts (`bench --arm`): :func:`print_arm_bench`,
  :func:`write_arm_csv`, :func:`plot_arm`.
- `check`: :func:`print_check` (the delegate rule tables and the GPU
  accelerator run), :func:`print_metadata`, :func:`print_arm_check`.
"""
from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

from edgevit.errors import EdgevitError, printable

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


def _where(row: dict) -> tuple:
    """The runs whose times compare: one model on one machine, delegate and thread count."""
    return (row.get("model"), row.get("target"), row.get("device"), row.get("runtime"), config_label(row))


def vs_fp32(result: dict) -> list[float | None]:
    """Each row's latency as a fraction of the same model's fp32 file run the
    same way (None where no such fp32 run has a time)."""
    fp32 = {_where(r): latency(r) for r in result["results"] if r.get("precision") == "fp32" and latency(r)}
    return [latency(r) / fp32[_where(r)] if latency(r) is not None and _where(r) in fp32 else None
            for r in result["results"]]


def table_rows(result: dict) -> tuple[list[str], list[list[str]]]:
    """The latency table; with a "vs fp32" column where another precision of
    a model runs beside its fp32 file (`bench --models a_fp32.tflite a_int8.tflite`)."""
    columns = ["model", "precision", "where", "delegate", "status", "init ms", "first ms", "p50 ms", "p90 ms",
               "p99 ms", "avg ms (std)", "peak MB", "on delegate"]
    ratios = vs_fp32(result)
    compared = any(ratio is not None and r.get("precision") != "fp32" for r, ratio in zip(result["results"], ratios))
    if compared:
        columns.insert(columns.index("avg ms (std)"), "vs fp32")
    rows = []
    for r, ratio in zip(result["results"], ratios):
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
        row = [r.get("model", "-"), r.get("precision", "-"), r.get("device") or r.get("target", "-"),
               config_label(r), status, _ms(r.get("init_ms")), _ms(r.get("first_ms")), _ms(r.get("p50_ms")),
               _ms(r.get("p90_ms")), _ms(r.get("p99_ms")), avg, _mb(r.get("peak_mem_mb")), delegated]
        if compared:
            row.insert(columns.index("vs fp32"), "-" if ratio is None else f"{ratio:.2f}")
        rows.append(row)
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
        table.add_column(col, overflow="fold", justify="right" if "ms" in col or "MB" in col or col == "vs fp32"
                         else "left")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    for r in result["results"]:
        skew = skew_note(r)
        if skew:
            console.print(f"  {r.get('model')} {r.get('device') or r.get('target')} {config_label(r)}: {skew}")
        if r.get("op_profile"):
            top = ", ".join(f"{o['node_type']} {o['percent']:.0f}%" for o in r["op_profile"][:5]
                            if o.get("percent") is not None)
            console.print(f"  top ops, {r.get('model')} {r.get('device') or r.get('target')} "
                          f"{config_label(r)}: {top}")


def skew_note(row: dict) -> str | None:
    """What a mean 5 % or more off the median means (None where it is not)."""
    mean, median = row.get("avg_ms"), row.get("p50_ms")
    if mean is None or not median or abs(mean - median) < 0.05 * median:
        return None
    side = "faster" if mean < median else "slower"
    spread = f" (min {_ms(row['min_ms'])}, max {_ms(row['max_ms'])} ms)" if row.get("min_ms") is not None and \
        row.get("max_ms") is not None else ""
    return (f"mean {_ms(mean)} ms against a median of {_ms(median)} ms: a few runs were much {side} than the "
            f"rest{spread}; the median is the figure to compare")


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


def _pyplot():
    matplotlib = require_matplotlib()
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: str | Path) -> None:
    """Callers write through edgevit.writing, which names the file a failed write was for."""
    try:
        fig.savefig(path, dpi=120, format="png")
    finally:
        plt.close(fig)


def plot(result: dict, path: str | Path, accuracies: dict[str, float] | None = None) -> None:
    """Median latency by (where, delegate) x precision as grouped bars (whisker
    to p90/p95 where known); an accuracy-vs-latency scatter when given."""
    plt = _pyplot()

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
    _save(plt, fig, path)


def require_matplotlib():
    try:
        import matplotlib
    except ImportError:
        raise EdgevitError("--plot needs matplotlib: `pip install matplotlib`.") from None
    return matplotlib


def _sizes(sizes: list[int], shown: int = 6) -> str:
    top = sorted(sizes, reverse=True)
    return ", ".join(map(str, top[:shown])) + (" ..." if len(top) > shown else "")


def print_metadata(model: str, summary: dict, stream=None) -> None:
    """What the file's edgevit and standard TFLite metadata say, and where
    they contradict the file (``edgevit.litert.metadata_check``)."""
    from rich.console import Console
    from rich.markup import escape

    console = Console(file=stream or sys.stdout, width=140)
    ev, std = summary["edgevit"], summary["standard"]

    def shown(value) -> str:  # what a file says is text, not markup, and its control characters are escapes
        return escape(printable(str(value)))

    console.print(f"[bold]edgevit metadata[/bold] - {shown(model)}: " + (
        f"{shown(ev['model'])}, {shown(ev['precision'])}, {shown(ev['num_classes'])} classes, input "
        f"{shown(ev['input'])}, output {shown(ev['output'])}, weights {shown(ev['weights'])}" if ev else "none"))
    console.print(f"[bold]standard TFLite metadata[/bold] - {shown(model)}: " + (
        f"{shown(std['name'])}, output {shown(repr(std['output']))}, {std['labels']} labels, normalisation mean/std "
        f"{std['normalization_mean_std']}, {shown(std['version'])}, parser >= {shown(std['min_parser_version'])}"
        + (f", licence {shown(std['licence'])}" if std["licence"] else "")
        if std else "none (MediaPipe Tasks and the Task Library need it for float inputs and category names)"))
    for problem in summary["problems"]:
        console.print(f"  [red]metadata contradicts the file[/red]: {shown(problem)}")


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


def _millions(count: float) -> str:
    m = count / 1e6
    return f"{m:.3f}" if m < 1 else f"{m:.2f}" if m < 10 else f"{m:.1f}"


def arm_tables(result: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, columns, rows) per CPU profile: kernel families x files, in
    millions of instructions per inference with the share of the total."""
    tables = []
    arm = result["arm"]
    for profile, description in arm["profiles"].items():
        rows = [r for r in result["results"] if r["profile"] == profile]
        families = sorted({f for r in rows for f in r["families"]},
                          key=lambda f: -max(r["families"].get(f, 0) for r in rows))
        body = []
        for family in families:
            cells = []
            for r in rows:
                value = r["families"].get(family, 0)
                share = value / r["instructions_per_inference"] if r["instructions_per_inference"] else 0
                cells.append(f"{_millions(value)} ({share:.0%})" if value else "-")
            body.append([family, *cells])
        body.append(["total (millions per inference)", *[_millions(r["instructions_per_inference"]) for r in rows]])
        first = rows[0]["instructions_per_inference"] if rows else 0
        if len(rows) > 1 and first:
            body.append([f"vs {rows[0]['file']}", *[f"{r['instructions_per_inference'] / first:.3f}x"
                                                     for r in rows]])
        title = (f"{profile}: {description}; millions of instructions per inference, {arm['kernels']} kernels, "
                 f"1 thread")
        tables.append((title, ["kernel family", *[r["file"] for r in rows]], body))
    return tables


def print_arm_bench(result: dict, kernels_shown: int = 8, stream=None) -> None:
    """The :func:`arm_tables`, then the XNNPACK kernels each file ran, the
    ``kernels_shown`` busiest first."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(file=stream or sys.stdout, width=160)
    arm = result["arm"]
    console.print(f"[bold]Arm64[/bold]: {arm['runtime']}; exact instruction counts, not milliseconds")
    for title, columns, rows in arm_tables(result):
        table = Table(title=title, title_justify="left")
        for i, col in enumerate(columns):
            table.add_column(col, overflow="fold", justify="left" if i == 0 else "right")
        for row in rows:
            table.add_row(*row)
        console.print(table)
    for r in result["results"]:
        total = r["instructions_per_inference"] or 1
        shares = {name: count / total for name, count in r["top_functions"]}
        named = ", ".join(f"{k} {shares[k]:.0%}" if k in shares else k for k in r["xnnpack_kernels"][:kernels_shown])
        more = len(r["xnnpack_kernels"]) - kernels_shown
        console.print(f"  XNNPACK kernels, {escape(r['file'])} on {r['profile']}: {escape(named) or 'none'}"
                      + (f" (+{more} more)" if more > 0 else ""))
    console.print(f"note: {arm['note']}")


def plot_arm(result: dict, path: str | Path) -> None:
    """Instructions per inference as bars stacked by kernel family, one panel
    per CPU profile, files side by side."""
    plt = _pyplot()

    profiles = list(result["arm"]["profiles"])
    files = list(dict.fromkeys(r["file"] for r in result["results"]))
    families = sorted({f for r in result["results"] for f in r["families"]},
                      key=lambda f: -sum(r["families"].get(f, 0) for r in result["results"]))
    colours = plt.get_cmap("tab20").colors
    width = max(10.0, (1.4 * len(files) + 3) * len(profiles))
    fig, axes = plt.subplots(1, len(profiles), figsize=(width, 6.0), squeeze=False, sharey=True)
    for ax, profile in zip(axes[0], profiles):
        rows = {r["file"]: r for r in result["results"] if r["profile"] == profile}
        bottoms = [0.0] * len(files)
        for fi, family in enumerate(families):
            heights = [rows[f]["families"].get(family, 0) / 1e6 if f in rows else 0.0 for f in files]
            ax.bar(range(len(files)), heights, 0.6, bottom=bottoms, color=colours[fi % len(colours)],
                   label=family if ax is axes[0][0] else None)
            bottoms = [b + h for b, h in zip(bottoms, heights)]
        for i, total in enumerate(bottoms):
            ax.annotate(f"{total:.1f}", (i, total), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(files)), files, rotation=20, ha="right", fontsize=8)
        ax.set_title(f"{profile} ({result['arm']['kernels']} kernels)", fontsize=9)
    axes[0][0].set_ylabel("millions of instructions per inference")
    fig.suptitle(f"{result['arm']['runtime']}\nexact instruction counts, not cycles: compare counts of one profile",
                 fontsize=9)
    fig.legend(loc="lower center", ncol=3, fontsize=7)
    fig.tight_layout(rect=(0, 0.2, 1, 0.93))
    _save(plt, fig, path)


def print_arm_check(model: str, check, stream=None) -> None:
    """`edgevit check --arm`: one row per (profile, kernels) against x86 XNNPACK."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(file=stream or sys.stdout, width=150)
    if not check.ran:
        console.print(f"[bold]Arm64 kernels[/bold] - {model}: [yellow]{escape(check.summary())}[/yellow]")
        return
    colour = "green" if check.agrees else "red"
    console.print(f"[bold]Arm64 kernels[/bold] - {model}: [{colour}]{escape(check.summary())}[/{colour}]")
    table = Table(title=f"against {check.to_dict()['reference']}, on {check.images}", title_justify="left")
    for col in ("profile", "kernels", "cosine mean", "cosine min", "max abs error", "top-1", "int8 steps (max)",
                "int8 outputs off", "floor", "verdict"):
        table.add_column(col, justify="left" if col in ("profile", "kernels", "verdict") else "right")
    for r in check.rows:
        a = r.agreement
        table.add_row(r.profile, r.kernels, f"{a['cosine_mean']:.6f}", f"{a['cosine_min']:.6f}",
                      f"{a['max_abs_logit_error']:.3g}", f"{a['top1_agreement']:.0%}",
                      "-" if r.int8_steps_max is None else str(r.int8_steps_max),
                      "-" if r.int8_outputs_off is None else f"{r.int8_outputs_off:.1%}", f"{r.floor:.4g}",
                      "agrees" if r.agrees else "DISAGREES")
    console.print(table)


def write_arm_csv(result: dict, path: str | Path) -> None:
    """One row per (file, profile): instructions per inference, in total and by kernel family."""
    families = sorted({f for r in result["results"] for f in r["families"]})
    fields = ["model", "file", "precision", "profile", "kernels", "threads", "instructions_per_inference", *families]
    try:
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
            writer.writeheader()
            for r in result["results"]:
                writer.writerow({**{k: r.get(k) for k in fields}, **{k: r["families"].get(k, 0) for k in families}})
    except OSError as err:
        raise EdgevitError(f"Cannot write CSV to {str(path)!r}: {err.strerror}.") from None
