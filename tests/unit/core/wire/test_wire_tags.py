"""Engine tags survive the trip through ``vllm_xargs``; a malformed stage count or program start is
refused."""

from __future__ import annotations

import pytest

from slo_core.slo import RequestKind, SLOTargets
from slo_core.wire.tags import EngineTags, decode_tags


def test_tags_round_trip_through_xargs_with_the_stated_stage_count() -> None:
    tags = EngineTags(
        targets=SLOTargets(RequestKind.COMPOUND, deadline_s=60.0, priority_weight=2.0),
        request_key="r-1", tenant="acme", deadline_at_s=1.7e9, program_id="p", stage=0, tier="agent",
        stages=4, program_start_at_s=1.7e9 - 12.5,
    )  # fmt: skip
    assert decode_tags(tags.to_xargs()) == tags
    assert decode_tags(EngineTags(targets=tags.targets).to_xargs()) == EngineTags(targets=tags.targets)


@pytest.mark.parametrize("stages", [0, -3, "many"])
def test_a_stage_count_below_one_or_not_a_number_is_malformed(stages: object) -> None:
    base = EngineTags(targets=SLOTargets(RequestKind.COMPOUND, deadline_s=60.0)).to_xargs()
    raw = {**base, "slo_stages": stages}
    with pytest.raises(ValueError):
        decode_tags(raw)


@pytest.mark.parametrize("start", ["nan", "inf", "-inf", "soon"])
def test_a_program_start_that_is_not_a_finite_number_is_malformed(start: object) -> None:
    base = EngineTags(targets=SLOTargets(RequestKind.COMPOUND, deadline_s=60.0)).to_xargs()
    with pytest.raises(ValueError):
        decode_tags({**base, "slo_program_start_at_s": start})
