"""Utilisation and queue length over time, as a PNG (needs the `plot` extra)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from dispatcher.simulate.engine import Run


class PlotError(Exception):
    pass


def _pyplot() -> Any:
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError as e:
        raise PlotError(
            "--plot needs matplotlib, which is not installed: "
            "pip install 'appwrapper-dispatcher[plot]' (or pip install matplotlib)"
        ) from e
    matplotlib.use("Agg")  # files only: no display needed
    return importlib.import_module("matplotlib.pyplot")


def check_available() -> None:
    """Raise PlotError now, rather than after a long run, when matplotlib is missing."""
    _pyplot()


def plot(run: Run, path: Path, title: str) -> None:
    """Two panels sharing the time axis (days from the first submission): GPUs in use
    (and held idle by partial gangs) as a percentage of the cluster, and queued jobs."""
    plt = _pyplot()
    days = [(t - run.start) / 86400 for t in run.times]
    total = run.total_gpus or 1
    busy = [100 * b / total for b in run.busy]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(11, 6))
    top.step(days, busy, where="post", linewidth=0.7, label="running")
    if any(run.held):
        held = [100 * (b + h) / total for b, h in zip(run.busy, run.held, strict=True)]
        top.step(days, held, where="post", linewidth=0.7,
                 label="running + held idle by partial gangs")
        top.legend(loc="lower right")
    top.set_ylabel(f"GPU utilisation % ({run.total_gpus} GPUs)")
    top.set_ylim(0, 105)
    top.set_title(title)
    bottom.step(days, run.queued, where="post", linewidth=0.7, color="tab:red",
                label="in the dispatcher's queue")
    if any(run.pending):
        bottom.step(days, run.pending, where="post", linewidth=0.7, color="tab:purple",
                    label="dispatched, pods pending for nodes")
        bottom.legend(loc="upper right")
    bottom.set_ylabel("jobs waiting")
    bottom.set_xlabel("days since the first submission")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as e:
        raise PlotError(f"{path}: cannot write the plot: {e.strerror or e}") from e
    except ValueError as e:  # a file extension matplotlib has no writer for
        raise PlotError(f"{path}: cannot write the plot: {e}") from e
    finally:
        plt.close(fig)
