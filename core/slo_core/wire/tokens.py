"""The one tokenizer-free token estimate: what the router, the sidecar and the predictor count text with.

Words and punctuation marks count one each; long words one per 4 characters (close to BPE tokenizers on
English). Deterministic and cheap; where the engine reports real counts (``usage``), those win.
"""

from __future__ import annotations

import re

_WORD = re.compile(r"\w+|[^\w\s]")


def approx_tokens(text: str) -> int:
    """At least 1."""
    count = 0
    for piece in _WORD.findall(text):
        count += max(1, (len(piece) + 3) // 4)
    return max(1, count)
