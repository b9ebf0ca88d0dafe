"""Prompt text for workload requests that carry a ``prompt_id`` (the shipped ShareGPT first turns).

Only predictors that read text need it (the output-length QRF); the simulator itself never does.
Prompt text is user data: never log it.
"""

from __future__ import annotations

import gzip
import json
from functools import lru_cache

from slo_core import data


@lru_cache(maxsize=1)
def _prompts() -> dict[str, str]:
    out: dict[str, str] = {}
    with gzip.open(data.path("sharegpt_first_turn_5k.jsonl.gz"), "rt", encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                d = json.loads(line)
                out[str(d["id"])] = str(d["prompt"])
    return out


def prompt_text(prompt_id: str) -> str:
    """The text of a shipped prompt; KeyError names the id when it is not shipped."""
    try:
        return _prompts()[prompt_id]
    except KeyError:
        raise KeyError(f"no shipped prompt with id {prompt_id!r}") from None
