"""A matplotlib figure as the chart data `@e2b/code-interpreter` gives as `result.chart`: its
kind (line, scatter, bar, pie, box_and_whisker, or a superchart of several axes), titles, labels,
units, scales, ticks and the plotted values, read back from the figure's artists after it was
drawn. What cannot be read as one of those kinds is `unknown`, with its title and no elements."""
import math
import re

import matplotlib.axes
import matplotlib.category
import matplotlib.container
import matplotlib.dates
import matplotlib.patches
from matplotlib.collections import PathCollection

UNIT = re.compile(r"[(\[]([^()\[\]]+)[)\]]\s*$")


def install():
    """Keeps each boxplot's statistics on its axes: the drawn boxes are plain lines, and the
    statistics are what a box-and-whisker chart is."""
    if getattr(matplotlib.axes.Axes.bxp, "_fp_recorded", False):
        return
    bxp = matplotlib.axes.Axes.bxp

    def recorded(self, bxpstats, *args, **kwargs):
        drawn = bxp(self, bxpstats, *args, **kwargs)
        self.__dict__.setdefault("_fp_boxplots", []).append(list(bxpstats))
        return drawn

    recorded._fp_recorded = True
    matplotlib.axes.Axes.bxp = recorded


def number(value):
    """A finite number as JSON can carry it (JSON has no NaN), rid of float noise
    (324.00000000000006); a float always, whole or not, as E2B's server sends them (its Python
    SDK's own tests check ticks and points with isinstance(..., float))."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(x):
        return None
    return float(f"{x:.12g}")


def text_or_none(text):
    return text if text else None


def unit_of(label):
    match = UNIT.search(label or "")
    return match.group(1).strip() if match else None


def converter_of(axis):
    get = getattr(axis, "get_converter", None)
    return get() if get else getattr(axis, "converter", None)


def scale_of(ax, axis):
    conv = converter_of(axis)
    if isinstance(conv, matplotlib.category.StrCategoryConverter):
        return "categorical"
    if conv is not None and "Date" in type(conv).__name__:
        return "datetime"
    return (ax.get_xscale if axis is ax.xaxis else ax.get_yscale)()


def reader(ax, axis):
    """How a plotted coordinate on this axis reads back: a date, a category or a number."""
    scale = scale_of(ax, axis)
    if scale == "datetime":
        def as_date(v):
            x = number(v)
            return matplotlib.dates.num2date(x).isoformat() if x is not None else None
        return as_date
    if scale == "categorical":
        units = axis.get_units()
        names = {number(code): name for name, code in getattr(units, "_mapping", {}).items()}
        return lambda v: names.get(number(v), number(v))
    return number


MATHDEFAULT = re.compile(r"^\$\\mathdefault\{(.*)\}\$$")


def labels_of(ticklabels):
    return [MATHDEFAULT.sub(r"\1", t.get_text()) for t in ticklabels]


def ticks_of(axis, read):
    """The ticks inside the axis's view (matplotlib places some beyond it) and their labels."""
    lo, hi = sorted(axis.get_view_interval())
    pairs = [(t, label) for t, label in zip(axis.get_ticklocs(), labels_of(axis.get_ticklabels())) if lo <= t <= hi]
    return [read(t) for t, _ in pairs], [label for _, label in pairs]


def axes_2d(ax, kind):
    x_label, y_label = ax.get_xlabel(), ax.get_ylabel()
    return {
        "type": kind,
        "title": text_or_none(ax.get_title()),
        "x_label": text_or_none(x_label),
        "y_label": text_or_none(y_label),
        "x_unit": unit_of(x_label),
        "y_unit": unit_of(y_label),
    }


def element_label(artist):
    label = artist.get_label() or ""
    return "" if label.startswith("_") else label  # matplotlib's own names (_child0, _nolegend_)


def point_chart(ax, kind, series):
    x, y = reader(ax, ax.xaxis), reader(ax, ax.yaxis)
    x_ticks, x_tick_labels = ticks_of(ax.xaxis, x)
    y_ticks, y_tick_labels = ticks_of(ax.yaxis, y)
    chart = axes_2d(ax, kind)
    chart.update({
        "x_scale": scale_of(ax, ax.xaxis),
        "y_scale": scale_of(ax, ax.yaxis),
        "x_ticks": x_ticks,
        "y_ticks": y_ticks,
        "x_tick_labels": x_tick_labels,
        "y_tick_labels": y_tick_labels,
        "elements": [{"label": element_label(artist), "points": [[x(px), y(py)] for px, py in points]} for artist, points in series],
    })
    return chart


def line_chart(ax):
    return point_chart(ax, "line", [(line, line.get_xydata()) for line in ax.get_lines()])


def scatter_chart(ax, collections):
    return point_chart(ax, "scatter", [(c, c.get_offsets()) for c in collections])


def bar_chart(ax, containers):
    chart = axes_2d(ax, "bar")
    elements = []
    for container in containers:
        horizontal = getattr(container, "orientation", "vertical") == "horizontal"
        axis = ax.yaxis if horizontal else ax.xaxis
        names = dict(zip((number(t) for t in axis.get_ticklocs()), labels_of(axis.get_ticklabels())))
        where = reader(ax, axis)
        values = getattr(container, "datavalues", None)
        for i, bar in enumerate(container.patches):
            centre = bar.get_y() + bar.get_height() / 2 if horizontal else bar.get_x() + bar.get_width() / 2
            value = values[i] if values is not None else (bar.get_width() if horizontal else bar.get_height())
            label = names.get(number(centre))
            elements.append({
                "label": label if label is not None else str(where(centre)),
                "value": number(value),
                "group": element_label(container),
            })
    chart["elements"] = elements
    return chart


def box_chart(ax, boxplots):
    chart = axes_2d(ax, "box_and_whisker")
    ticks = labels_of(ax.get_xticklabels())
    elements = []
    for stats in boxplots:
        for i, s in enumerate(stats):
            label = s.get("label")
            elements.append({
                "label": str(label) if label is not None else (ticks[len(elements)] if len(elements) < len(ticks) else str(i + 1)),
                "min": number(s["whislo"]),
                "first_quartile": number(s["q1"]),
                "median": number(s["med"]),
                "third_quartile": number(s["q3"]),
                "max": number(s["whishi"]),
                "outliers": [number(v) for v in s.get("fliers", [])],
            })
    chart["elements"] = elements
    return chart


def pie_chart(ax, wedges):
    return {
        "type": "pie",
        "title": text_or_none(ax.get_title()),
        "elements": [{"label": element_label(w), "angle": number(abs(w.theta2 - w.theta1)), "radius": number(w.r)} for w in wedges],
    }


def chart_of_axes(ax):
    wedges = [p for p in ax.patches if isinstance(p, matplotlib.patches.Wedge)]
    if wedges:
        return pie_chart(ax, wedges)
    boxplots = ax.__dict__.get("_fp_boxplots")
    if boxplots:
        return box_chart(ax, boxplots)
    bars = [c for c in ax.containers if isinstance(c, matplotlib.container.BarContainer)]
    if bars:
        return bar_chart(ax, bars)
    if ax.get_lines():
        return line_chart(ax)
    scatters = [c for c in ax.collections if isinstance(c, PathCollection)]
    if scatters:
        return scatter_chart(ax, scatters)
    return {"type": "unknown", "title": text_or_none(ax.get_title()), "elements": []}


def chart_of(fig):
    """The figure's chart, or None for a figure with no axes. The figure must have been drawn
    (its tick labels are set when it is)."""
    axes = [ax for ax in fig.get_axes() if ax.get_visible()]
    if not axes:
        return None
    if len(axes) == 1:
        return chart_of_axes(axes[0])
    suptitle = getattr(fig, "_suptitle", None)
    return {
        "type": "superchart",
        "title": text_or_none(suptitle.get_text() if suptitle is not None else ""),
        "elements": [chart_of_axes(ax) for ax in axes],
    }
