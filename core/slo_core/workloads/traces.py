"""Arrival traces: the Azure LLM inference CSV, JSONL traces and the shipped built-ins.

A trace is arrival times (seconds from its first arrival) with each request's input and output
length. Formats accepted by path: the Azure CSV (``TIMESTAMP, ContextTokens, GeneratedTokens``;
optionally gzip-compressed) and JSONL lines ``{"timestamp": ms, "input_length": n, "output_length":
m}``. Built-ins: ``azure-conv-2023`` and ``azure-code-2023`` (Splitwise's Azure traces, shipped in
``slo_core/data``) and ``sharegpt`` (ShareGPT first turns: lengths and prompt ids, no timestamps, so
it always needs Poisson arrivals).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path

import numpy as np
import numpy.typing as npt

from slo_core import data

BUILTIN_TRACES: dict[str, str] = {
    "azure-conv-2023": "azure2023_conv.csv.gz",
    "azure-code-2023": "azure2023_code.csv.gz",
    "sharegpt": "sharegpt_first_turn_5k.jsonl.gz",
}


@dataclass(frozen=True)
class Trace:
    """Requests of a trace in arrival order; ``arrival_s`` is None for a lengths-only source."""

    name: str
    arrival_s: npt.NDArray[np.float64] | None
    input_tokens: npt.NDArray[np.int64]
    output_tokens: npt.NDArray[np.int64]
    prompt_ids: tuple[str, ...] | None = None

    def __len__(self) -> int:
        return len(self.input_tokens)

    @property
    def span_s(self) -> float:
        if self.arrival_s is None or len(self.arrival_s) < 2:
            return 0.0
        return float(self.arrival_s[-1] - self.arrival_s[0])

    @property
    def rate_rps(self) -> float:
        """The trace's own mean arrival rate (requests per second)."""
        return (len(self) - 1) / self.span_s if self.span_s > 0 else 0.0


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return io.TextIOWrapper(path.open("rb"), encoding="utf-8")


def _timestamp_s(text: str) -> float:
    # Azure writes 7 fractional digits; datetime takes at most 6
    head, _, frac = text.strip().partition(".")
    return datetime.fromisoformat(head).timestamp() + (float("0." + frac) if frac else 0.0)


def _rows_csv(fh: io.TextIOBase, where: str) -> Iterator[tuple[float | None, int, int, str | None]]:
    reader = csv.DictReader(fh)
    need = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"}
    if reader.fieldnames is None or not need <= {f.strip() for f in reader.fieldnames}:
        raise ValueError(f"{where}: an Azure trace CSV needs the columns {', '.join(sorted(need))}")
    for lineno, raw in enumerate(reader, 2):
        try:
            row = {k.strip(): v for k, v in raw.items()}
            yield _timestamp_s(row["TIMESTAMP"]), int(row["ContextTokens"]), int(row["GeneratedTokens"]), None
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}:{lineno}: bad trace row ({exc})") from None


def _rows_jsonl(fh: io.TextIOBase, where: str) -> Iterator[tuple[float | None, int, int, str | None]]:
    for lineno, line in enumerate(fh, 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            if "timestamp" in d:
                yield float(d["timestamp"]) / 1000.0, int(d["input_length"]), int(d["output_length"]), None
            else:  # the shipped ShareGPT sample: lengths and an id, no time
                yield None, int(d["prompt_tokens"]), int(d["output_tokens"]), str(d["id"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"{where}:{lineno}: a JSONL trace line needs timestamp (ms), input_length, "
                f"output_length ({exc})"
            ) from None


def read_trace(path: str | Path, name: str | None = None) -> Trace:
    """Read a trace file (format from the name: ``.csv[.gz]`` or ``.jsonl[.gz]``)."""
    p = Path(path)
    stem = p.name.removesuffix(".gz")
    if not p.is_file():
        raise ValueError(f"trace file {str(p)!r} does not exist")
    with _open_text(p) as fh:
        if stem.endswith(".csv"):
            rows = list(_rows_csv(fh, str(p)))
        elif stem.endswith((".jsonl", ".json")):
            rows = list(_rows_jsonl(fh, str(p)))
        else:
            raise ValueError(f"trace {str(p)!r}: expected a .csv or .jsonl file (optionally .gz)")
    if not rows:
        raise ValueError(f"trace {str(p)!r} has no requests")
    timed = rows[0][0] is not None
    if timed:
        rows.sort(key=lambda r: r[0] or 0.0)
        t = np.array([r[0] for r in rows], dtype=np.float64)
        arrival: npt.NDArray[np.float64] | None = t - t[0]
    else:
        arrival = None
    ids = tuple(r[3] or "" for r in rows) if rows[0][3] is not None else None
    return Trace(
        name=name or p.name,
        arrival_s=arrival,
        input_tokens=np.maximum(1, np.array([r[1] for r in rows], dtype=np.int64)),
        output_tokens=np.maximum(1, np.array([r[2] for r in rows], dtype=np.int64)),
        prompt_ids=ids,
    )


@lru_cache(maxsize=8)
def load_trace(name_or_path: str) -> Trace:
    """A built-in trace by name, else a trace file by path (cached: traces are immutable)."""
    builtin = BUILTIN_TRACES.get(name_or_path)
    if builtin is not None:
        return read_trace(data.path(builtin), name=name_or_path)
    if not Path(name_or_path).exists():
        raise ValueError(
            f"unknown trace {name_or_path!r}: neither a built-in ({', '.join(BUILTIN_TRACES)}) nor a file"
        )
    return read_trace(name_or_path)
