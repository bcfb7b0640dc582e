"""The overview's charts: minute buckets, percentiles, and SVG whose text is escaped."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from orchestrator.console.charts import CallSample, bar_chart, hour_of_calls, line_chart, percentile

NOW = datetime(2026, 1, 31, 12, 0, tzinfo=timezone.utc)


def test_percentiles_are_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([5.0], 99) == 5.0
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 95), percentile(values, 99)) == (50.0, 95.0, 99.0)


def test_the_last_hours_calls_are_bucketed_by_minute_and_older_ones_left_out() -> None:
    samples = [
        CallSample(NOW - timedelta(minutes=90), 1.0, "ok"),  # older than the hour
        CallSample(NOW - timedelta(seconds=30), 10.0, "ok"),
        CallSample(NOW - timedelta(seconds=20), 30.0, "not_found"),
        CallSample(NOW - timedelta(seconds=10), 0.0, "started"),  # under way: no latency yet
        CallSample(NOW - timedelta(minutes=59, seconds=30), 20.0, "ok"),
    ]
    hour = hour_of_calls(samples, NOW)
    assert len(hour.per_minute) == 60 and hour.total == 4 and hour.errors == 1
    assert hour.per_minute[-1] == 3 and hour.per_minute[0] == 1
    assert hour.p50_ms[-1] == 10.0 and hour.p95_ms[-1] == 30.0 and hour.p50_ms[30] is None
    assert hour.overall_p99_ms == 30.0


def test_charts_are_svg_with_escaped_labels() -> None:
    bars = str(bar_chart([0, 2, 4], label="<b>calls</b>"))
    assert bars.startswith("<svg") and bars.count("<rect") == 3 and "&lt;b&gt;calls" in bars and "<b>" not in bars
    lines = str(line_chart({"p50": [1.0, None, 3.0, 4.0]}, label="latency", unit="ms"))
    assert lines.count("<polyline") == 2  # a gap where a minute had no call
