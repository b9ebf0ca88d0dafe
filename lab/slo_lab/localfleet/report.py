"""The demo's side-by-side table, ``report.md``, ``results.json`` and PNG plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from slo_lab.localfleet.replay import CallTrace

ROWS = (
    ("token goodput (ratio of ideal)", "goodput_token_ratio", "{:.1%}"),
    ("token goodput (weighted tokens/s)", "goodput_token_per_s", "{:.1f}"),
    ("requests meeting their SLO", "attainment", "{:.1%}"),
    ("TTFT p50 / p99 (s)", ("ttft_p50_s", "ttft_p99_s"), "{:.2f}"),
    ("TBT p50 / p99 (s)", ("tbt_p50_s", "tbt_p99_s"), "{:.3f}"),
    ("E2E p50 / p99 (s)", ("e2e_p50_s", "e2e_p99_s"), "{:.1f}"),
    ("completed / rejected", ("completed", "rejected"), "{}"),
)


def _fmt(m: dict[str, Any], key: str | tuple[str, ...], fmt: str) -> str:
    keys = (key,) if isinstance(key, str) else key
    vals = [m.get(k) for k in keys]
    return " / ".join("–" if v is None else fmt.format(v) for v in vals)


def table(runs: dict[str, dict[str, Any]]) -> str:
    labels = list(runs)
    head = "| metric | " + " | ".join(
        f"{lab} ({runs[lab]['engine_policy']} + {runs[lab]['routing']})" for lab in labels
    )
    lines = [head + " |", "|---" * (len(labels) + 1) + "|"]
    for title, key, fmt in ROWS:
        lines.append(f"| {title} | " + " | ".join(_fmt(runs[lab], key, fmt) for lab in labels) + " |")
    tiers = sorted({t for lab in labels for t in runs[lab]["by_tier"]})
    for t in tiers:
        cells = []
        for lab in labels:
            m = runs[lab]["by_tier"].get(t, {})
            cells.append(
                f"{_fmt(m, 'attainment', '{:.0%}')} met, goodput {_fmt(m, 'goodput_token_ratio', '{:.0%}')}"
            )
        lines.append(f"| tier {t} | " + " | ".join(cells) + " |")
    if len(labels) == 2:
        a, b = (runs[lab].get("goodput_token_per_s") or 0.0 for lab in labels)
        ratio = f"{a / b:.2f}×" if b > 0 else "∞"
        lines.append(
            f"\n{labels[0]} delivers {ratio} the token goodput of {labels[1]} on the identical replay."
        )
    return "\n".join(lines)


def _plots(out: Path, runs: dict[str, dict[str, Any]]) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    files = []
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for lab, m in runs.items():
        g = m["goodput_over_time"]
        x = np.arange(len(g["token"])) * g["bucket_s"]
        ax.plot(x, np.asarray(g["token"]) / g["bucket_s"], label=lab)
    ax.set(
        xlabel="time since start (s)", ylabel="token goodput (weighted tokens/s)", title="Goodput over time"
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "goodput_over_time.png", dpi=120)
    files.append("goodput_over_time.png")
    plt.close(fig)

    tiers = sorted({t for m in runs.values() for t in m["by_tier"]})
    fig, ax = plt.subplots(figsize=(8, 3.5))
    width = 0.8 / max(1, len(runs))
    for i, (lab, m) in enumerate(runs.items()):
        vals = [(m["by_tier"].get(t, {}).get("attainment") or 0.0) for t in tiers]
        ax.bar(np.arange(len(tiers)) + i * width, vals, width, label=lab)
    ax.set_xticks(np.arange(len(tiers)) + width * (len(runs) - 1) / 2, tiers, rotation=20)
    ax.set(ylabel="share meeting SLO", ylim=(0, 1), title="SLO attainment by tier")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "attainment_by_tier.png", dpi=120)
    files.append("attainment_by_tier.png")
    plt.close(fig)

    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    for ax, key in zip(axes, ("ttft", "tbt", "e2e"), strict=True):
        for lab, m in runs.items():
            xs = np.sort(np.asarray(m["latency_samples"][key], dtype=float))
            if len(xs):
                ax.plot(xs, np.arange(1, len(xs) + 1) / len(xs), label=lab)
        ax.set(xlabel=f"{key.upper()} (s)", ylabel="CDF", title=key.upper())
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "latency_cdfs.png", dpi=120)
    files.append("latency_cdfs.png")
    plt.close(fig)
    return files


def write_report(
    out: Path, runs: dict[str, dict[str, Any]], meta: dict[str, Any], *, versus: str = ""
) -> str:
    """Write report.md, results.json and plots into ``out``; returns the markdown table."""
    md_table = table(runs)
    try:
        plots = _plots(out, runs)
    except ImportError:
        plots = []
    slim = {lab: {k: v for k, v in m.items() if k != "latency_samples"} for lab, m in runs.items()}
    (out / "results.json").write_text(json.dumps({"meta": meta, "runs": slim}, indent=2), encoding="utf-8")
    w = meta["workload"]
    lines = [
        "# slofleet demo",
        "",
        f"{meta['jobs']} jobs from `{w['trace']}` (mix latency:deadline:compound {w['mix']}), "
        f"{meta['engines']} simulated `{meta['profile']}` engines per fleet, time running "
        f"{meta['speedup']}× the GPU's speed (rates, SLOs and durations scaled alike). Both fleets got "
        "the identical replay through their router, with the official openai client.",
        "",
        md_table,
        "",
        *(["## Live vs simulated", "", versus, ""] if versus else []),
        "Counts by outcome: " + ", ".join(f"{lab}: {runs[lab]['counts']}" for lab in runs),
        "",
        *[f"![{p}]({p})" for p in plots],
        "",
    ]
    (out / "report.md").write_text("\n".join(lines), encoding="utf-8")
    return md_table


WITHIN_POINTS = 10.0  # issue 14: every tier's live attainment within 10 points of the simulator's


def _ratio(runs: dict[str, dict[str, Any]], a: str, b: str) -> float | None:
    x, y = (runs[k].get("goodput_token_per_s") or 0.0 for k in (a, b))
    return x / y if y > 0 else None


def comparison(live: dict[str, dict[str, Any]], sim: dict[str, dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """Live vs simulated, per fleet and tier: attainment and token goodput side by side, and the verdict
    (every tier within ``WITHIN_POINTS``; the fleets' token-goodput ratio the same way round)."""
    labels = [lab for lab in live if lab in sim]
    head = "| | " + " | ".join(f"{lab} live | {lab} sim | Δ pts" for lab in labels) + " |"
    lines = [head, "|---" * (3 * len(labels) + 1) + "|"]
    worst: tuple[float, str] = (0.0, "")
    tiers = sorted({t for lab in labels for t in (*live[lab]["by_tier"], *sim[lab]["by_tier"])})
    for t in tiers:
        cells = []
        for lab in labels:
            a = live[lab]["by_tier"].get(t, {}).get("attainment")
            b = sim[lab]["by_tier"].get(t, {}).get("attainment")
            d = None if a is None or b is None else 100.0 * (a - b)
            if d is not None and abs(d) > abs(worst[0]):
                worst = (d, f"{lab} {t}")
            cells += [_fmt({"v": a}, "v", "{:.0%}"), _fmt({"v": b}, "v", "{:.0%}"),
                      "–" if d is None else f"{d:+.0f}"]  # fmt: skip
        lines.append(f"| {t} met SLO | " + " | ".join(cells) + " |")
    cells = []
    for lab in labels:
        a, b = live[lab].get("goodput_token_ratio"), sim[lab].get("goodput_token_ratio")
        d = "–" if a is None or b is None else f"{100.0 * (a - b):+.0f}"
        cells += [_fmt({"v": a}, "v", "{:.1%}"), _fmt({"v": b}, "v", "{:.1%}"), d]
    lines.append("| token goodput (share of ideal) | " + " | ".join(cells) + " |")
    if any("demoted_by_tier" in side[lab] for side in (live, sim) for lab in labels):
        cells = []
        for lab in labels:
            a = sum(live[lab].get("demoted_by_tier", {}).values())
            b = sum(sim[lab].get("demoted_by_tier", {}).values())
            cells += [str(a), str(b), f"{a - b:+d}"]
        lines.append("| demoted to best effort (requests and calls) | " + " | ".join(cells) + " |")
    verdict: dict[str, Any] = {"worst_tier_gap_pts": round(worst[0], 1), "worst_tier": worst[1]}
    verdict["tiers_within"] = abs(worst[0]) <= WITHIN_POINTS
    text = "\n".join(lines)
    if len(labels) == 2:
        rl, rs = _ratio(live, *labels), _ratio(sim, *labels)
        verdict["ratio_live"], verdict["ratio_sim"] = rl, rs
        same = rl is not None and rs is not None and (rl >= 1.0) == (rs >= 1.0)
        verdict["ratio_same_way"] = same
        fr = "{:.2f}×"
        text += (
            f"\n\n{labels[0]}/{labels[1]} token goodput: live "
            f"{'∞' if rl is None else fr.format(rl)}, simulated {'∞' if rs is None else fr.format(rs)} "
            f"({'same way round' if same else 'NOT the same way round'})."
        )
    for lab in labels:
        line = describe_demotion_timing(lab, live[lab].get("demotion_timing"))
        if line:
            text += "\n" + line
    text += (
        f"\nEvery tier within {WITHIN_POINTS:g} points of the simulator: "
        f"{'yes' if verdict['tiers_within'] else 'NO'} "
        f"(largest gap {worst[0]:+.0f} points, {worst[1] or '–'})."
    )
    return text, verdict


def job_differences(
    jobs: list[str],
    live: list[Any],
    sim: list[Any],
    tiers: list[str],
    *,
    late: list[bool] | None = None,
    traces: tuple[list[list[CallTrace]], list[list[CallTrace]]] | None = None,
) -> dict[str, Any]:
    """Where live and simulated outcomes of the same jobs disagree (outcomes aligned with ``jobs``):
    per tier, jobs that met their SLO on one side only and jobs refused on one side only, so a gap in
    the table can be traced to the requests behind it. ``late``: whether the client sent each job late
    (the host, not the fleet); jobs met in simulation only that were also sent late are listed again
    under ``met_sim_only_sent_late``. ``traces`` (live, simulated; each job's calls as sent): jobs the
    router demoted (any call) on one side only."""
    diff: dict[str, Any] = {}
    for i, (job_id, tier, a, b) in enumerate(zip(jobs, tiers, live, sim, strict=True)):
        met_a, met_b = a.gains["request"] > 0, b.gains["request"] > 0
        row = diff.setdefault(
            tier,
            {"met_live_only": [], "met_sim_only": [], "met_sim_only_sent_late": [], "rejected_live_only": [],
             "rejected_sim_only": [], "demoted_live_only": [], "demoted_sim_only": []},
        )  # fmt: skip
        if met_a != met_b:
            row["met_live_only" if met_a else "met_sim_only"].append(job_id)
            if met_b and late is not None and late[i]:
                row["met_sim_only_sent_late"].append(job_id)
        if a.rejected != b.rejected:
            row["rejected_live_only" if a.rejected else "rejected_sim_only"].append(job_id)
        if traces is not None:
            dem_a = any(c.demoted for c in traces[0][i])
            dem_b = any(c.demoted for c in traces[1][i])
            if dem_a != dem_b:
                row["demoted_live_only" if dem_a else "demoted_sim_only"].append(job_id)
    return diff


def describe_demotion_timing(label: str, timing: dict[str, Any] | None) -> str:
    """One line: demoted calls on each side and the live client's send lag behind the simulator, for the
    calls demoted live only against all calls (empty when nothing was demoted)."""
    if not timing or not (timing["calls_demoted"]["live"] or timing["calls_demoted"]["sim"]):
        return ""
    n = timing["calls_demoted"]

    def lag(key: str) -> str:
        st = timing[key]
        return "–" if not st["n"] else f"{st['median_s']:+.2f} s (max {st['max_s']:+.2f} s, {st['n']} calls)"

    return (
        f"{label} demoted calls: {n['live']} live, {n['sim']} simulated, {n['both']} the same call; sent "
        f"later live than simulated, median: demoted live only {lag('send_lag_demoted_live_only')}, "
        f"every call {lag('send_lag_all_calls')}."
    )


def demotion_timing(live: list[list[CallTrace]], sim: list[list[CallTrace]]) -> dict[str, Any]:
    """Demoted calls on each side, and how much later the live client sent them than the simulator
    released the same call (same job, stage and position): if calls demoted live only were sent much
    later than the simulator sent them, the lag (the host, the client's round trips) and not the
    routing rule explains the extra demotions. Lags in seconds of the run's clock."""

    def stats(xs: list[float]) -> dict[str, float | int]:
        if not xs:
            return {"n": 0}
        ys = sorted(xs)
        return {"n": len(ys), "median_s": ys[len(ys) // 2], "max_s": ys[-1], "mean_s": sum(ys) / len(ys)}

    counts = {"live": 0, "sim": 0, "both": 0}
    lag_all: list[float] = []
    lag: dict[str, list[float]] = {"live_only": [], "sim_only": [], "both": []}
    for a_calls, b_calls in zip(live, sim, strict=True):
        counts["live"] += sum(c.demoted for c in a_calls)
        counts["sim"] += sum(c.demoted for c in b_calls)
        for a, b in zip(a_calls, b_calls, strict=False):  # a live job that failed stops early
            if a.stage != b.stage:
                break
            d = a.sent_s - b.sent_s
            lag_all.append(d)
            if a.demoted and b.demoted:
                counts["both"] += 1
                lag["both"].append(d)
            elif a.demoted or b.demoted:
                lag["live_only" if a.demoted else "sim_only"].append(d)
    return {
        "calls_demoted": counts,
        "send_lag_all_calls": stats(lag_all),
        **{f"send_lag_demoted_{k}": stats(v) for k, v in lag.items()},
    }


def describe_differences(label: str, diff: dict[str, Any], examples: int = 4) -> str:
    """One line per tier with disagreements, e.g. ``slofleet latency-low: met live only 3 (j12 ...)``."""
    lines = []
    for tier, row in sorted(diff.items()):
        parts = []
        for key, ids in row.items():
            if ids:
                more = " …" if len(ids) > examples else ""
                parts.append(f"{key.replace('_', ' ')} {len(ids)} ({' '.join(ids[:examples])}{more})")
        if parts:
            lines.append(f"{label} {tier}: " + "; ".join(parts))
    return "\n".join(lines)
