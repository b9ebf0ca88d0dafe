"""The one tokenizer-free token estimate: what the router, the sidecar and the predictor count text with.

Words and punctuation marks count one each; long words one per 4 characters (close to BPE tokenizers on
English). Deterministic and cheap; where the engine reports real counts (``usage``), those win.
"""

from __future__ import annotations

import re

# A word of n characters counts ceil(n / 4): exactly the matches of ``\w{1,4}`` within it, so one
# findall counts everything (no Python loop over the words: the router runs this on every prompt)
_PIECE = re.compile(r"\w{1,4}|[^\w\s]")


def approx_tokens(text: str) -> int:
    """At least 1."""
    return max(1, len(_PIECE.findall(text)))
