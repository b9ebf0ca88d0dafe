"""engine-sim with a tag key verifies SLO tags as the vLLM plugin does: signed ones count, unsigned or
forged ones are best-effort and counted, and the key file is followed as the operator rotates it."""

from __future__ import annotations

import os
import time
from pathlib import Path

from slo_core.slo import RequestKind, SLOTargets
from slo_core.wire.keyring import KeyRing, render_keyring
from slo_core.wire.signing import sign
from slo_core.wire.tags import EngineTags
from slo_lab.engine_sim.runner import EngineRunner
from slo_lab.engine_sim.settings import EngineSimSettings

OLD, NEW = b"o" * 32, b"n" * 32
TAGS = EngineTags(SLOTargets(RequestKind.DEADLINE, deadline_s=5.0), request_key="r")


def test_only_signed_tags_count_and_a_rotated_key_is_followed(tmp_path: Path) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text(render_keyring(KeyRing(OLD)))
    runner = EngineRunner(EngineSimSettings(tag_key_file=str(key_file)))
    now = time.time()
    signed = sign(TAGS.to_xargs(), OLD, now)
    assert runner.trusted(TAGS, signed) is TAGS
    forged = {**TAGS.to_xargs(), "slo_sig": f"{int(now)}.{'0' * 64}"}
    assert runner.trusted(TAGS, forged) is None
    assert runner.trusted(TAGS, TAGS.to_xargs()) is None
    assert runner.trusted(None, None) is None and runner.unsigned_tags == 2
    # the operator rotates the Secret: the new key verifies, the previous one still does
    tmp = tmp_path / "keys.new"
    tmp.write_text(render_keyring(KeyRing(NEW, OLD, now)))
    os.replace(tmp, key_file)
    time.sleep(1.1)  # the file is re-checked at most once a second
    assert runner.trusted(TAGS, sign(TAGS.to_xargs(), NEW, now)) is TAGS
    assert runner.trusted(TAGS, signed) is TAGS


def test_without_a_key_tags_are_trusted_as_before() -> None:
    runner = EngineRunner(EngineSimSettings())
    assert runner.trusted(TAGS, TAGS.to_xargs()) is TAGS and runner.unsigned_tags == 0
