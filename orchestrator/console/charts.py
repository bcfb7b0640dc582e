"""The overview's charts: tool calls per minute and latency percentiles over the last hour,
from the audit log's `tool.call` rows (each carries its duration and outcome), drawn as inline
SVG on the server (no script, nothing fetched). All pure."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from markupsafe import Markup, escape

MINUTES = 60


@dataclass(frozen=True)
class CallSample:
    at: datetime
    duration_ms: float
    outcome: str


@dataclass(frozen=True)
class HourOfCalls:
    per_minute: list[int]  # oldest minute first; the last is the current one
    p50_ms: list[float | None]  # per minute, None for a minute without finished calls
    p95_ms: list[float | None]
    total: int
    errors: int
    overall_p50_ms: float | None
    overall_p95_ms: float | None
    overall_p99_ms: float | None


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of the values, None for none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), -(-len(ordered) * q // 100)))
    return ordered[int(rank) - 1]


def hour_of_calls(samples: list[CallSample], now: datetime) -> HourOfCalls:
    """Bucket the last hour's calls by minute. A call still `started` counts as a call, not
    as a latency."""
    start = now - timedelta(minutes=MINUTES)
    counts = [0] * MINUTES
    durations: list[list[float]] = [[] for _ in range(MINUTES)]
    errors = 0
    for sample in samples:
        if not start <= sample.at <= now:
            continue
        minute = min(MINUTES - 1, int((sample.at - start).total_seconds() // 60))
        counts[minute] += 1
        if sample.outcome != "started":
            durations[minute].append(sample.duration_ms)
        if sample.outcome not in ("ok", "started"):
            errors += 1
    every = [d for minute in durations for d in minute]
    return HourOfCalls(
        per_minute=counts,
        p50_ms=[percentile(d, 50) for d in durations],
        p95_ms=[percentile(d, 95) for d in durations],
        total=sum(counts),
        errors=errors,
        overall_p50_ms=percentile(every, 50),
        overall_p95_ms=percentile(every, 95),
        overall_p99_ms=percentile(every, 99),
    )


WIDTH, HEIGHT, PAD = 600, 140, 24


def bar_chart(values: list[int], *, label: str) -> Markup:
    """Bars, one per minute, scaled to the largest; the label is escaped."""
    top = max(values) if values and max(values) > 0 else 1
    step = (WIDTH - 2 * PAD) / max(1, len(values))
    bars = []
    for i, value in enumerate(values):
        height = (HEIGHT - 2 * PAD) * value / top
        x = PAD + i * step
        bars.append(
            f'<rect x="{x:.1f}" y="{HEIGHT - PAD - height:.1f}" width="{max(step - 1, 1):.1f}" height="{height:.1f}">'
            f"<title>{value}</title></rect>"
        )
    return _svg(label, f"max {top}/min", "".join(bars), "bars")


def line_chart(series: dict[str, list[float | None]], *, label: str, unit: str) -> Markup:
    """One polyline per series (gaps where a value is None), scaled to the largest value."""
    values = [v for points in series.values() for v in points if v is not None]
    top = max(values) if values and max(values) > 0 else 1.0
    lines = []
    for index, (name, points) in enumerate(series.items()):
        step = (WIDTH - 2 * PAD) / max(1, len(points) - 1)
        segment: list[str] = []
        runs: list[list[str]] = []
        for i, value in enumerate(points):
            if value is None:
                if segment:
                    runs.append(segment)
                segment = []
                continue
            y = HEIGHT - PAD - (HEIGHT - 2 * PAD) * value / top
            segment.append(f"{PAD + i * step:.1f},{y:.1f}")
        if segment:
            runs.append(segment)
        for run in runs:
            points_attr = " ".join(run) if len(run) > 1 else f"{run[0]} {run[0]}"
            lines.append(f'<polyline class="series-{index}" points="{points_attr}"><title>{escape(name)}</title></polyline>')
    legend = ", ".join(str(escape(name)) for name in series)
    return _svg(label, f"max {top:.0f} {escape(unit)} ({legend})", "".join(lines), "lines")


def _svg(label: str, note: str, body: str, kind: str) -> Markup:
    return Markup(
        f'<svg class="chart {kind}" role="img" aria-label="{escape(label)}" viewBox="0 0 {WIDTH} {HEIGHT}"'
        f' width="{WIDTH}" height="{HEIGHT}" xmlns="http://www.w3.org/2000/svg">'
        f'<line class="axis" x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}"/>'
        f'<text x="{PAD}" y="14">{escape(label)}: {note}</text>{body}</svg>'
    )
