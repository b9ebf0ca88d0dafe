"""PNG plots of a bench sweep (matplotlib, Agg backend, imported only when plots are asked for)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def _series(records: Sequence[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        if "error" not in r:
            by.setdefault((r["policy"], r["router"]), []).append(r)
    for rs in by.values():
        rs.sort(key=lambda r: r["rps"])
    return by


def write_plots(
    records: Sequence[dict[str, Any]],
    samples: dict[tuple[str, str, float], dict[str, list[float]]],
    out_dir: str | Path,
    goodput: str = "token",
) -> list[Path]:
    """goodput_vs_load.png, attainment_by_kind.png, latency_cdf.png, goodput_over_time.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    series = _series(records)
    multi_router = len({r for _, r in series}) > 1
    written: list[Path] = []

    def label(policy: str, router: str) -> str:
        return f"{policy}/{router}" if multi_router else policy

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for (pol, rt), rs in series.items():
        x = [r["rps"] for r in rs]
        axes[0].plot(
            x, [r.get(f"goodput_{goodput}_ratio") or 0.0 for r in rs], marker="o", label=label(pol, rt)
        )
        axes[1].plot(x, [r.get("attainment") or 0.0 for r in rs], marker="o", label=label(pol, rt))
    axes[0].set(xlabel="load (requests/s)", ylabel=f"{goodput} goodput / ideal", title="goodput vs load")
    axes[1].set(xlabel="load (requests/s)", ylabel="SLO attainment", title="attainment vs load")
    for ax in axes:
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    written.append(_save(fig, out / "goodput_vs_load.png"))

    kinds = sorted({k for r in records for k in r.get("by_kind", {})})
    if kinds:
        fig, axes = plt.subplots(1, len(kinds), figsize=(4 * len(kinds), 3.6), squeeze=False)
        for ax, kind in zip(axes[0], kinds, strict=True):
            for (pol, rt), rs in series.items():
                ys = [r["by_kind"].get(kind, {}).get("attainment") or 0.0 for r in rs]
                ax.plot([r["rps"] for r in rs], ys, marker="o", label=label(pol, rt))
            ax.set(xlabel="load (requests/s)", ylabel="attainment", title=kind, ylim=(0, 1.05))
            ax.grid(alpha=0.3)
        axes[0][-1].legend(fontsize=8)
        written.append(_save(fig, out / "attainment_by_kind.png"))

    top = max((rps for _, _, rps in samples), default=None)
    if top is not None:
        fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
        for (pol, rt, rps), s in sorted(samples.items()):
            if rps != top:
                continue
            for ax, key in zip(axes, ("ttft", "tbt", "e2e"), strict=True):
                if len(s[key]):
                    q = np.linspace(0.0, 1.0, 500)  # a CDF of 500 quantiles draws fast and looks the same
                    ax.plot(np.quantile(np.asarray(s[key]), q), q, label=label(pol, rt))
        for ax, key in zip(axes, ("TTFT", "TBT", "E2E"), strict=True):
            ax.set(xscale="log", xlabel=f"{key} (s)", ylabel="CDF", title=f"{key} at {top:g} req/s")
            ax.grid(alpha=0.3)
        axes[-1].legend(fontsize=8)
        written.append(_save(fig, out / "latency_cdf.png"))

        fig, ax = plt.subplots(figsize=(7, 3.8))
        for (pol, rt), rs in series.items():
            for r in rs:
                if r["rps"] == top:
                    got = r["goodput_over_time"]
                    t = np.arange(len(got["token"])) * got["bucket_s"]
                    ax.plot(t, np.asarray(got["token"]) / got["bucket_s"], label=label(pol, rt))
        ax.set(xlabel="time (s)", ylabel="token goodput / s", title=f"goodput over time at {top:g} req/s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        written.append(_save(fig, out / "goodput_over_time.png"))
    return written


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
