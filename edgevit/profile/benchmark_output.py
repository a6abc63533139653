"""Read what TensorFlow Lite / LiteRT `benchmark_model` prints.

Formats understood (seen in TFLite 2.x and LiteRT builds of the tool):

* the summary line ``Inference timings in us: Init: 52687, First inference:
  19105, Warmup (avg): 14452.5, Inference (avg): 14290.9`` (and the older
  ``Average inference timings in us: Warmup: ..., Init: ..., Inference: ...``);
* run statistics ``count=70 first=14941 curr=14066 min=13728 max=16145
  avg=14290.9 std=452`` to which LiteRT builds append ``p5=... median=...
  p95=...`` (``count=1 curr=...`` when every run took the same time); the first
  such line is the warm-up, the second the counted runs;
* memory lines (``Memory footprint delta from the start of the tool (MB):
  init=... overall=...``, ``Overall peak memory footprint (MB) via periodic
  monitoring: ...``);
* delegation lines (``Replacing 120 out of 150 node(s) with delegate
  (TfLiteGpuDelegateV2) node, yielding 3 partitions ...``) and ERROR lines;
* op-profiling tables (``--enable_op_profiling=true``): blocks headed
  ``Profiling Info for Benchmark Initialization:`` / ``Operator-wise Profiling
  Info for Regular Benchmark Runs:``, tables headed ``===== Run Order =====``
  etc. whose columns are read by the names in their header row (tab-separated
  or CSV), because TFLite versions differ in which columns they print.

Every log line may carry a ``INFO: `` / ``WARNING: `` / ``ERROR: `` prefix.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

_PREFIX = re.compile(r"^(?:(?:INFO|WARN|WARNING|ERROR|VERBOSE|DEBUG)\s*:\s*|[IWEF]\d{4} [\d:.]+\s+\d+\s+\S+\]\s*)")
_TIMINGS = re.compile(
    r"Inference timings in us:\s*Init:\s*(?P<init>[\d.eE+-]+),\s*First inference:\s*(?P<first>[\d.eE+-]+),"
    r"\s*Warmup \(avg\):\s*(?P<warmup>[\d.eE+-]+|-?nan),\s*Inference \(avg\):\s*(?P<avg>[\d.eE+-]+)")
_OLD_TIMINGS = re.compile(
    r"Average inference timings in us:\s*Warmup:\s*(?P<warmup>[\d.eE+-]+),\s*Init:\s*(?P<init>[\d.eE+-]+),"
    r"\s*(?:no stats:|Inference:)\s*(?P<avg>[\d.eE+-]+)")
_STAT_FIELD = re.compile(r"(\w+)=(-?[\d.]+(?:[eE][+-]?\d+)?|-?nan|-?inf)")
_MEMORY = re.compile(r"Memory footprint delta from the start of the tool \(MB\):\s*init=(?P<init>[\d.eE+-]+)"
                     r"\s+overall=(?P<overall>[\d.eE+-]+)")
_PEAK = re.compile(r"Overall peak memory footprint \(MB\) via periodic monitoring:\s*(?P<peak>[\d.eE+-]+)")
_REPLACING = re.compile(r"Replacing (?P<delegated>\d+) out of (?P<total>\d+) node\(s\) with delegate "
                        r"\((?P<delegate>[^)]+)\) node, yielding (?P<partitions>\d+) partitions")
_APPLIED = re.compile(r"Explicitly applied (?P<name>\S+) delegate, and the model graph will be "
                      r"(?:(?P<complete>completely)|partially) executed by the delegate"
                      r"(?: w/ (?P<kernels>\d+) delegate kernels)?")
_NOT_APPLIED = re.compile(r"Though (?P<name>\S+) delegate is explicitly applied, the model graph will not be")
_INIT_MS = re.compile(r"Initialized session in (?P<ms>[\d.eE+-]+)\s*ms")
_TITLE = re.compile(r"^=+\s+(?P<title>.+?)\s+=+$")

# Column names as printed by StatsCalculator, normalised to identifiers.
_COLUMN_NAMES = {
    "node type": "node_type", "start": "start_ms", "first": "first_ms", "avg ms": "avg_ms",
    "avg_ms": "avg_ms", "%": "percent", "cdf%": "cdf_percent", "cdf %": "cdf_percent",
    "avg %": "percent", "mem kb": "mem_kb", "times called": "times_called", "name": "name",
    "count": "count",
}
BLOCK_TITLES = {
    "Profiling Info for Benchmark Initialization:": "init",
    "Operator-wise Profiling Info for Regular Benchmark Runs:": "run",
}


def strip_prefix(line: str) -> str:
    return _PREFIX.sub("", line.rstrip("\r\n"), count=1)


def _number(text: str):
    text = text.strip().rstrip("%").strip()
    try:
        value = float(text)
    except ValueError:
        return None
    return value


@dataclass
class RunStats:
    """One ``count=... avg=...`` line (microseconds)."""
    count: int
    first: float | None = None
    curr: float | None = None
    min: float | None = None
    max: float | None = None
    avg: float | None = None
    std: float | None = None
    p5: float | None = None
    median: float | None = None
    p95: float | None = None

    @classmethod
    def parse(cls, line: str) -> RunStats | None:
        fields = dict(_STAT_FIELD.findall(line))
        if "count" not in fields:
            return None
        values = {k: _number(v) for k, v in fields.items() if k in cls.__dataclass_fields__}
        count = int(values.pop("count") or 0)
        stats = cls(count=count, **values)
        if count and stats.avg is None and stats.curr is not None:  # "count=N curr=X(all same)"
            stats.first = stats.min = stats.max = stats.avg = stats.curr
            stats.std = 0.0
        return stats


@dataclass
class ProfileTable:
    block: str            # "init", "run" or "" (outside a known block)
    scope: str            # "primary", "delegate" or "subgraph <index>"
    title: str            # "Run Order", "Top by Computation Time", "Summary by node type", ...
    columns: list[str]
    rows: list[dict] = field(default_factory=list)


@dataclass
class BenchmarkOutput:
    init_us: float | None = None
    first_us: float | None = None
    warmup_avg_us: float | None = None
    inference_avg_us: float | None = None
    warmup: RunStats | None = None
    runs: RunStats | None = None
    memory_init_mb: float | None = None
    memory_overall_mb: float | None = None
    peak_memory_mb: float | None = None
    # The last delegate the runtime reported ("Replacing N out of M node(s)
    # with delegate (NAME) node, yielding K partitions"): K counts delegated
    # and CPU partitions together.
    delegate: str | None = None
    delegated_nodes: int | None = None
    total_nodes: int | None = None
    partitions: int | None = None
    # From "Explicitly applied GPU delegate, ...": kernels the delegate runs
    # (one per delegated partition) and whether it took the whole graph.
    applied: dict = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    tables: list[ProfileTable] = field(default_factory=list)

    @property
    def has_timings(self) -> bool:
        return self.inference_avg_us is not None or (self.runs is not None and self.runs.count > 0)

    def table(self, title: str, block: str = "run", scope: str = "primary") -> ProfileTable | None:
        for t in self.tables:
            if t.title.lower() == title.lower() and t.block == block and t.scope == scope:
                return t
        return None

    def op_type_summary(self) -> list[dict]:
        """Per op type: count, avg ms, share of time (regular runs)."""
        table = self.table("Summary by node type")
        if table is not None:
            return [{"node_type": r.get("node_type"), "count": r.get("count"), "avg_ms": r.get("avg_ms"),
                     "percent": r.get("percent")} for r in table.rows]
        order = self.table("Run Order")
        if order is None:
            return []
        totals: dict[str, dict] = {}
        for row in order.rows:
            entry = totals.setdefault(row.get("node_type"), {"node_type": row.get("node_type"), "count": 0,
                                                              "avg_ms": 0.0, "percent": 0.0})
            entry["count"] += 1
            entry["avg_ms"] += row.get("avg_ms") or 0.0
            entry["percent"] += row.get("percent") or 0.0
        return sorted(totals.values(), key=lambda e: -e["avg_ms"])

    def to_dict(self) -> dict:
        return asdict(self)


def _columns(header: str) -> tuple[list[str], str]:
    """Column identifiers of a table header and the separator it uses."""
    if "\t" in header:
        parts, sep = [p.strip() for p in header.strip("\n").split("\t")], "\t"
    else:
        parts, sep = [p.strip() for p in header.split(",")], ","
    names = []
    for part in parts:
        if not part:
            continue
        key = part.strip("[]").strip().lower()
        names.append(_COLUMN_NAMES.get(key, re.sub(r"\W+", "_", key).strip("_")))
    return names, sep


def _row(line: str, columns: list[str], sep: str) -> dict | None:
    if sep == "\t":
        cells = [c.strip() for c in line.split("\t")]
        if cells and cells[0] == "":
            cells = cells[1:]
        if len(cells) > len(columns):  # a name containing a tab: rejoin the tail
            cells = cells[:len(columns) - 1] + ["\t".join(cells[len(columns) - 1:])]
    else:
        cells = [c.strip() for c in line.split(",", len(columns) - 1)]
    if len(cells) != len(columns):
        return None
    row = {}
    for name, cell in zip(columns, cells):
        if name in ("node_type", "name"):
            row[name] = cell
        else:
            value = _number(cell)
            row[name] = int(value) if value is not None and name in ("count", "times_called") else value
    return row


def parse(text: str) -> BenchmarkOutput:
    """Everything recognisable in one run's combined stdout+stderr."""
    out = BenchmarkOutput()
    raw_lines = text.splitlines()
    lines = [strip_prefix(line) for line in raw_lines]
    stats_lines: list[RunStats] = []
    block, scope = "", "primary"
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        raw = raw_lines[i]
        i += 1
        if not line:
            continue
        if raw.lstrip().startswith("ERROR") or line.startswith("Benchmarking failed") or \
                re.match(r"^Failed to ", line):
            out.errors.append(line)
        if line in BLOCK_TITLES:
            block, scope = BLOCK_TITLES[line], "primary"
            continue
        if line.startswith("Delegate internal"):
            scope = "delegate"
            continue
        m = re.match(r"^Subgraph \(index: (\d+)", line)
        if m and line.endswith(":"):
            scope = f"subgraph {m.group(1)}"
            continue
        if line.startswith("Primary graph") and line.endswith(":"):
            scope = "primary"
            continue
        m = _TITLE.match(line)
        if m:
            # The header row follows the title; rows follow until a blank line.
            while i < len(lines) and not lines[i].strip():
                i += 1
            if i >= len(lines):
                break
            columns, sep = _columns(lines[i])
            i += 1
            table = ProfileTable(block=block, scope=scope, title=m.group("title"), columns=columns)
            while i < len(lines) and lines[i].strip() and not _TITLE.match(lines[i].strip()):
                row = _row(lines[i], columns, sep)
                if row is None:
                    break
                table.rows.append(row)
                i += 1
            out.tables.append(table)
            continue
        if m := _TIMINGS.search(line):
            out.init_us, out.first_us = _number(m["init"]), _number(m["first"])
            out.warmup_avg_us, out.inference_avg_us = _number(m["warmup"]), _number(m["avg"])
        elif m := _OLD_TIMINGS.search(line):
            out.init_us, out.warmup_avg_us = _number(m["init"]), _number(m["warmup"])
            out.inference_avg_us = _number(m["avg"])
        elif m := _MEMORY.search(line):
            out.memory_init_mb, out.memory_overall_mb = _number(m["init"]), _number(m["overall"])
        elif m := _PEAK.search(line):
            out.peak_memory_mb = _number(m["peak"])
        elif m := _REPLACING.search(line):
            out.delegate = m["delegate"]
            out.delegated_nodes, out.total_nodes = int(m["delegated"]), int(m["total"])
            out.partitions = int(m["partitions"])
        elif m := _APPLIED.search(line):
            out.applied[m["name"]] = {"delegate_kernels": 1 if m["complete"] else int(m["kernels"] or 0),
                                      "fully_delegated": bool(m["complete"])}
        elif m := _NOT_APPLIED.search(line):
            out.applied[m["name"]] = {"delegate_kernels": 0, "fully_delegated": False}
        elif m := _INIT_MS.search(line):
            if out.init_us is None:
                out.init_us = _number(m["ms"]) * 1000.0
        elif line.startswith("count="):
            # ("Timings (microseconds): count=..." is the op profiler's own summary.)
            stats = RunStats.parse(line)
            if stats is not None:
                stats_lines.append(stats)
    if stats_lines:
        if len(stats_lines) >= 2:
            out.warmup, out.runs = stats_lines[0], stats_lines[-1]
        else:
            out.runs = stats_lines[0]
    return out
