"""The report's PNG plots: what chat felt per SLO window, what batch got done, what the controller
allowed. Each function takes plain rows from the warehouse and writes one PNG.

Windows where chat broke its SLO are shaded on every time plot, so cause and effect line up.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never a display, also on a desktop

import matplotlib.pyplot as plt  # noqa: E402

CHAT = "#1f6feb"
BATCH = "#2da44e"
SLO_LINE = "#cf222e"
BREACH = "#ffebe9"
SIZE = (9.0, 3.2)
DPI = 110


def run_span_s(windows: list[dict]) -> float:
    """Seconds from the run's start to the end of its last window."""
    return max((w["t_rel_s"] + w["window_len_s"] for w in windows), default=0.0)


def time_axis(windows: list[dict]) -> tuple[float, str]:
    """Seconds per x unit and its label: minutes for runs over ten minutes, else seconds."""
    return (
        (60.0, "minutes since start") if run_span_s(windows) > 600 else (1.0, "seconds since start")
    )


def latency_plot(
    windows: list[dict], column: str, slo_ms: float | None, title: str, path: Path
) -> Path:
    """Chat p99 per window (at the window's middle) against the SLO line."""
    unit, _ = time_axis(windows)
    fig, ax = _figure(windows, title, "ms")
    _shade_breaches(ax, windows, unit)
    xs = [(w["t_rel_s"] + w["window_len_s"] / 2) / unit for w in windows]
    ys = [_nan(w[column]) for w in windows]
    ax.plot(xs, ys, marker="o", markersize=3, color=CHAT, linewidth=1.4, label="chat p99")
    if slo_ms is not None:
        ax.axhline(
            slo_ms, color=SLO_LINE, linestyle="--", linewidth=1.2, label=f"SLO {slo_ms:g} ms"
        )
    ax.set_ylim(bottom=0)
    _legend(ax)
    return _save(fig, path)


def throughput_plot(windows: list[dict], path: Path) -> Path:
    """Batch tokens/s per window as bars, so idle windows show as gaps rather than slopes."""
    unit, _ = time_axis(windows)
    fig, ax = _figure(windows, "Batch tokens/s per window (prompt + output)", "tokens/s")
    _shade_breaches(ax, windows, unit)
    xs = [w["t_rel_s"] / unit for w in windows]
    widths = [w["window_len_s"] / unit for w in windows]
    ys = [w["batch_tokens_per_s"] or 0.0 for w in windows]
    ax.bar(xs, ys, width=widths, align="edge", color=BATCH, alpha=0.85, label="batch tokens/s")
    _legend(ax)
    return _save(fig, path)


def caps_plot(caps: list[dict], windows: list[dict], path: Path) -> Path:
    """The controller's caps per replica over time: batch seats above, the batch step target
    below (nothing under policies that leave the engine stock)."""
    unit, label = time_axis(windows)
    fig, (seats, chunk) = plt.subplots(2, 1, figsize=(SIZE[0], SIZE[1] * 1.6), sharex=True, dpi=DPI)
    seats.set_title("Controller caps per replica", loc="left", fontsize=11)
    for ax in (seats, chunk):
        _shade_breaches(ax, windows, unit)
        ax.grid(axis="y", alpha=0.3)
        ax.spines[["top", "right"]].set_visible(False)
    seats.set_xlim(0, run_span_s(windows) / unit or 1.0)
    seats.set_ylabel("batch seats")
    chunk.set_ylabel("batch step target ms")
    chunk.set_xlabel(label)
    if not caps:
        seats.text(
            0.5,
            0.5,
            "no controller decisions recorded",
            transform=seats.transAxes,
            ha="center",
            va="center",
            color="#57606a",
        )
    end = run_span_s(windows)
    for replica in sorted({c["replica"] for c in caps}):
        own = [c for c in caps if c["replica"] == replica]
        own.append(
            {**own[-1], "t_rel_s": max(end, own[-1]["t_rel_s"])}
        )  # a cap holds until the end
        xs = [c["t_rel_s"] / unit for c in own]
        seats.step(
            xs, [0 if c["pause"] else c["batch_seats"] for c in own], where="post", label=replica
        )
        targets = [c["batch_step_target_ms"] for c in own]
        if any(t is not None for t in targets):
            chunk.step(xs, [float("nan") if t is None else t for t in targets], where="post")
    seats.set_ylim(bottom=0)
    chunk.set_ylim(bottom=0)
    if caps:
        seats.legend(
            frameon=False,
            fontsize=8,
            ncols=8,
            loc="lower right",
            bbox_to_anchor=(1.0, 1.0),
            borderaxespad=0.2,
        )
    return _save(fig, path)


def _figure(windows: list[dict], title: str, ylabel: str):
    unit, xlabel = time_axis(windows)
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    ax.set_xlim(0, run_span_s(windows) / unit or 1.0)  # every time plot spans the same run
    ax.set_title(title, loc="left", fontsize=11)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)
    return fig, ax


def _shade_breaches(ax, windows: list[dict], unit: float) -> None:
    for w in windows:
        if not w["slo_met"]:
            start = w["t_rel_s"] / unit
            ax.axvspan(start, start + w["window_len_s"] / unit, color=BREACH, zorder=0, linewidth=0)


def _legend(ax) -> None:
    from matplotlib.patches import Patch

    handles, _ = ax.get_legend_handles_labels()
    handles.append(Patch(facecolor=BREACH, edgecolor="#ff8182", label="SLO breached"))
    # above the axes, beside the title, so it never covers a data point
    ax.legend(
        handles=handles,
        frameon=False,
        fontsize=8,
        ncols=len(handles),
        loc="lower right",
        bbox_to_anchor=(1.0, 1.0),
        borderaxespad=0.2,
    )


def _nan(value: float | None) -> float:
    return math.nan if value is None else value


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
