"""GMAX's snapshot table: columns kept across calls equal those of a fresh table, and the per-stage
and per-program groups the estimate aggregates over."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from slo_core.policies.base import RequestView
from slo_core.policies.gmax_priority import Groups
from slo_core.policies.gmax_snapshot import Columns, SnapshotTable
from slo_core.slo import RequestKind, SLOTargets

SLOS = (
    SLOTargets(RequestKind.LATENCY, ttft_s=1.0, tbt_s=0.05),
    SLOTargets(RequestKind.DEADLINE, deadline_s=30.0),
    SLOTargets(RequestKind.COMPOUND, deadline_s=90.0),
    SLOTargets(RequestKind.BEST_EFFORT),
)


def _view(rng: random.Random, rid: str, running: bool) -> RequestView:
    slo = rng.choice(SLOS)
    compound = slo.kind is RequestKind.COMPOUND
    gen = rng.randint(1, 200) if running else 0
    prompt = rng.randint(1, 3000)
    return RequestView(
        request_id=rid,
        slo=slo,
        arrival_s=-rng.uniform(0.0, 30.0),
        prompt_tokens=prompt,
        max_tokens=4096,
        generated_tokens=gen,
        computed_tokens=prompt + gen if running else rng.randint(0, prompt),
        output_bound=rng.choice([None, gen + rng.randint(1, 900)]),
        tenant=rng.choice(["a", "b", "c"]),
        program_id=f"p{rng.randint(0, 6)}" if compound else None,
        stage=rng.randint(0, 3) if compound else None,
        program_attained_tokens=rng.randint(0, 500) if compound else 0,
        deadline_at_s=rng.choice([None, rng.uniform(0.0, 60.0)]),
        waiting_since_s=None if running else -rng.uniform(0.0, 5.0),
    )


def _as_rows(c: Columns) -> list[tuple[object, ...]]:
    """Each request's column values (table-assigned codes of tenants and programs as names/order)."""
    out = []
    for i, rid in enumerate(c.ids):
        row: list[object] = [rid, bool(c.running[i]), c.tenant_names[int(c.tenant[i])]]
        for f in dataclasses.fields(c):
            if f.name in ("ids", "running", "tenant", "tenant_names", "program"):
                continue
            row.append(np.asarray(getattr(c, f.name))[i].tobytes())
        row.append(int(c.program[i]) >= 0)
        out.append(tuple(row))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_a_table_kept_across_calls_gives_the_columns_of_a_fresh_one(seed: int) -> None:
    """Snapshots replaced (progress), kept (the same object), new and gone, over many calls: the
    kept table's columns equal a fresh table's, field by field and bit for bit."""
    rng = random.Random(seed)
    kept = SnapshotTable()
    live: dict[str, RequestView] = {f"r{i}": _view(rng, f"r{i}", rng.random() < 0.3) for i in range(60)}
    next_id = 60
    for _ in range(40):
        for rid in rng.sample(sorted(live), k=min(len(live), rng.randint(0, 12))):
            v = live[rid]
            live[rid] = dataclasses.replace(
                v, generated_tokens=v.generated_tokens + 1, computed_tokens=v.computed_tokens + 1
            )
        for rid in rng.sample(sorted(live), k=min(len(live), rng.randint(0, 5))):
            del live[rid]
        for _ in range(rng.randint(0, 6)):
            live[f"r{next_id}"] = _view(rng, f"r{next_id}", rng.random() < 0.3)
            next_id += 1
        views = list(live.values())
        rng.shuffle(views)
        running = [v for v in views if v.generated_tokens > 0]
        waiting = [v for v in views if v.generated_tokens == 0]
        got = kept.columns(waiting, running)
        want = SnapshotTable().columns(waiting, running)
        assert _as_rows(got) == _as_rows(want)
        # the same programs are told apart alike
        assert np.array_equal(got.program >= 0, want.program >= 0)
        same = got.program[:, None] == got.program[None, :]
        assert np.array_equal(same, want.program[:, None] == want.program[None, :])


def test_a_table_that_outgrew_its_requests_starts_over_and_still_reads_every_snapshot() -> None:
    rng = random.Random(3)
    table = SnapshotTable()
    for k in range(6):  # 12,000 new requests a call: the sixth finds 60,000 rows (> 50,000) and starts over
        views = [_view(rng, f"b{k}-{i}", False) for i in range(12_000)]
        c = table.columns(views, [])
        assert c.ids == [v.request_id for v in views]
        assert np.array_equal(c.prompt_tokens, np.array([v.prompt_tokens for v in views], dtype=float))
    assert table._size == 12_000


@pytest.mark.parametrize("seed", range(20))
def test_program_groups_from_the_stage_groups_equal_grouping_the_programs(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 400))
    program = rng.integers(-1, 30, n)
    stage = rng.integers(-1, 6, n)
    mask = (program >= 0) & (rng.random(n) < 0.7)
    stages = Groups(program * 1_000_003 + stage + 1, mask)
    got = stages.coarser(1_000_003)
    want = Groups(program, mask)
    assert got.n == want.n
    assert np.array_equal(got.inv, want.inv)
    assert np.array_equal(got.keys, want.keys)
