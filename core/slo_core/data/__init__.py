"""Data shipped with the package (traces, GPU profiles, prompts); see SOURCES.md for provenance."""

from __future__ import annotations

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent


def path(name: str) -> Path:
    """Absolute path of a shipped data file; a clear error names the files that do exist."""
    candidate = DATA_DIR / name
    if not candidate.exists():
        known = sorted(p.name for p in DATA_DIR.iterdir() if not p.name.startswith(("_", ".")))
        raise FileNotFoundError(f"no shipped data file {name!r}; known: {', '.join(known)}")
    return candidate
