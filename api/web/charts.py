"""Chart geometry for the pages' SVG, computed here and drawn by the templates' macros.

Pure functions: numbers in, rectangles and labels out. Every label is plain
text that the templates escape like any other value.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

# Told apart without colour as well: the legend and each bar's tooltip name the series.
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f")
_PLOT_TOP = 10
_AXIS_LEFT = 72
_AXIS_BOTTOM = 28


@dataclass(frozen=True)
class Rect:
    x: float
    y: float
    width: float
    height: float
    color: str
    series: str
    column: str
    value: float
    text: str

    @property
    def title(self) -> str:
        return f"{self.column} {self.series}: {self.text}" if self.column != self.series else f"{self.series}: {self.text}"


@dataclass(frozen=True)
class Label:
    x: float
    y: float
    text: str


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    rects: tuple[Rect, ...]
    x_labels: tuple[Label, ...]
    y_labels: tuple[Label, ...]
    gridlines: tuple[float, ...]
    legend: tuple[tuple[str, str], ...]
    baseline: float
    plot_left: float
    plot_right: float


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5 or 5 times a power of ten that is at least ``value`` (an axis' top)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * power * (1 + 1e-9):
            return step * power
    return 10 * power


def series_colors(series: Sequence[str]) -> dict[str, str]:
    return {name: PALETTE[index % len(PALETTE)] for index, name in enumerate(series)}


def stacked_columns(
    columns: Sequence[tuple[str, Mapping[str, float]]],
    *,
    value_text: Callable[[float], str],
    width: int = 720,
    height: int = 240,
    label_every: int = 1,
) -> Chart:
    """One column per (label, {series: value}), its series stacked bottom-up in the legend's order.

    Negative values (corrections larger than the day's usage) are drawn as zero;
    the tables beside each chart carry the exact numbers.
    """
    series = sorted({name for _, values in columns for name in values})
    colors = series_colors(series)
    top = nice_ceiling(max((sum(max(v, 0.0) for v in values.values()) for _, values in columns), default=0.0))
    plot_height = height - _PLOT_TOP - _AXIS_BOTTOM
    baseline = height - _AXIS_BOTTOM
    slot = (width - _AXIS_LEFT - 8) / max(len(columns), 1)
    bar_width = max(slot * 0.7, 1.0)
    rects: list[Rect] = []
    x_labels: list[Label] = []
    for index, (column, values) in enumerate(columns):
        x = _AXIS_LEFT + index * slot + (slot - bar_width) / 2
        stacked = 0.0
        for name in series:
            value = values.get(name, 0.0)
            if value <= 0:
                continue
            bar_height = value / top * plot_height
            stacked += bar_height
            rects.append(
                Rect(x, baseline - stacked, bar_width, bar_height, colors[name], name, column, value, value_text(value))
            )
        if index % label_every == 0:
            x_labels.append(Label(x + bar_width / 2, baseline + 16, column))
    ticks = [top * step / 4 for step in range(5)]
    return Chart(
        width=width,
        height=height,
        rects=tuple(rects),
        x_labels=tuple(x_labels),
        y_labels=tuple(Label(_AXIS_LEFT - 6, baseline - tick / top * plot_height + 4, value_text(tick)) for tick in ticks),
        gridlines=tuple(baseline - tick / top * plot_height for tick in ticks),
        legend=tuple((name, colors[name]) for name in series),
        baseline=baseline,
        plot_left=_AXIS_LEFT,
        plot_right=width - 8,
    )


@dataclass(frozen=True)
class Meter:
    """One horizontal bar: ``used`` of ``limit``, the part past the limit drawn apart."""

    label: str
    used_text: str
    limit_text: str
    fraction: float
    over: bool
    width: int = 480
    height: int = 22

    @property
    def fill_width(self) -> float:
        return self.width * min(max(self.fraction, 0.0), 1.0)


def meter(label: str, used: float, limit: float, used_text: str, limit_text: str) -> Meter:
    fraction = used / limit if limit > 0 else (1.0 if used > 0 else 0.0)
    return Meter(label=label, used_text=used_text, limit_text=limit_text, fraction=fraction, over=used > limit)


def horizontal_bars(
    rows: Sequence[tuple[str, float]],
    *,
    value_text: Callable[[float], str],
    maximum: float | None = None,
    width: int = 640,
    row_height: int = 22,
    label_width: int = 160,
) -> Chart:
    """One bar per (label, value), longest scale ``maximum`` (or the largest value, rounded up)."""
    top = maximum if maximum is not None else nice_ceiling(max((value for _, value in rows), default=0.0))
    plot_width = width - label_width - 90
    rects = []
    labels = []
    for index, (label, value) in enumerate(rows):
        y = _PLOT_TOP + index * row_height
        bar = max(value, 0.0) / top * plot_width if top > 0 else 0.0
        rects.append(Rect(label_width, y + 3, bar, row_height - 6, PALETTE[0], label, label, value, value_text(value)))
        labels.append(Label(label_width - 6, y + row_height / 2 + 4, label))
    height = _PLOT_TOP * 2 + row_height * max(len(rows), 1)
    return Chart(
        width=width,
        height=height,
        rects=tuple(rects),
        x_labels=(),
        y_labels=tuple(labels),
        gridlines=(),
        legend=(),
        baseline=height - _PLOT_TOP,
        plot_left=label_width,
        plot_right=label_width + plot_width,
    )


@dataclass(frozen=True)
class Line:
    series: str
    color: str
    points: str  # SVG polyline points, "x,y x,y ..."
    last_text: str  # the series' latest value, for its legend and tooltip


@dataclass(frozen=True)
class LineChart:
    width: int
    height: int
    lines: tuple[Line, ...]
    x_labels: tuple[Label, ...]
    y_labels: tuple[Label, ...]
    gridlines: tuple[float, ...]
    baseline: float
    plot_left: float
    plot_right: float


def percent_lines(
    series: Sequence[tuple[str, Sequence[tuple[float, float | None]]]],
    *,
    x_text: Callable[[float], str],
    width: int = 720,
    height: int = 200,
) -> LineChart:
    """One line per (name, [(x, percent)]) on a 0-100 % axis, x scaled to the span of every point.

    A point without a value breaks its line there (a missing reading is drawn as a gap, not as 0 %).
    The x axis shows its two ends as ``x_text`` says them.
    """
    xs = [x for _, points in series for x, value in points if value is not None]
    low, high = (min(xs), max(xs)) if xs else (0.0, 1.0)
    span = high - low or 1.0
    plot_height = height - _PLOT_TOP - _AXIS_BOTTOM
    baseline = height - _AXIS_BOTTOM
    right = width - 8
    colors = series_colors([name for name, _ in series])
    lines: list[Line] = []
    for name, points in series:
        segments: list[list[str]] = [[]]
        for x, value in points:
            if value is None:
                segments.append([])
                continue
            px = _AXIS_LEFT + (x - low) / span * (right - _AXIS_LEFT)
            py = baseline - min(max(value, 0.0), 100.0) / 100.0 * plot_height
            segments[-1].append(f"{px:.1f},{py:.1f}")
        last = next((value for _, value in reversed(points) if value is not None), None)
        last_text = "n/a" if last is None else f"{last:.0f}%"
        lines.extend(Line(name, colors[name], " ".join(segment), last_text) for segment in segments if segment)
    ticks = (0, 25, 50, 75, 100)
    return LineChart(
        width=width,
        height=height,
        lines=tuple(lines),
        x_labels=(Label(_AXIS_LEFT, baseline + 16, x_text(low)), Label(right, baseline + 16, x_text(high))) if xs else (),
        y_labels=tuple(Label(_AXIS_LEFT - 6, baseline - tick / 100 * plot_height + 4, f"{tick}%") for tick in ticks),
        gridlines=tuple(baseline - tick / 100 * plot_height for tick in ticks),
        baseline=baseline,
        plot_left=_AXIS_LEFT,
        plot_right=right,
    )
