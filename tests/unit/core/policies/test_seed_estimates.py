"""The seed-paper policies' shared estimates: what is left to prefill, as engines count computed tokens.

Engines (vLLM v1, and the simulator alike) count a decoding request's newest sampled token as not yet
computed (``computed = prompt + generated - 1``); routers fed by a state stream may see it computed.
Either way a decoding request has nothing left to prefill.
"""

from __future__ import annotations

import builders
import pytest
from builders import latency, request

from slo_core.perf import load_profile
from slo_core.policies.base import RequestView
from slo_core.policies.registry import make_engine_policy
from slo_core.policies.seed_estimates import decode_core_s, remaining_prompt_tokens
from slo_core.policies.slide_batching import SlideBatchingParams, queue_metrics
from slo_core.policies.slos_serve import SLOsServeParams, dp_view
from slo_core.policies.tempo import TempoParams, service_densities, service_densities_scalar
from slo_core.sim.engine import SimEngine
from slo_core.sim.engine_types import EngineConfig
from slo_core.sim.request import SimRequest
from slo_core.sim.views import request_view

H100 = load_profile("h100-llama3-8b-tp1")


@pytest.mark.parametrize(
    ("prompt", "gen", "computed", "left"),
    [
        (500, 0, 0, 500),  # new
        (500, 0, 200, 300),  # prompt chunked part way
        (500, 0, 499, 1),  # one prompt token to go
        (500, 1, 500, 0),  # first token out, decoding (engine count)
        (500, 7, 506, 0),  # decoding (engine count)
        (500, 7, 507, 0),  # decoding (all computed: a state stream's count)
        (500, 7, 0, 507),  # preempted: recomputes prompt and output
        (500, 7, 300, 207),  # recompute part way
        (500, 7, 505, 2),  # recompute with two tokens to go
    ],
)
def test_remaining_prompt_tokens(prompt: int, gen: int, computed: int, left: int) -> None:
    r = request("r", latency(1.0), prompt=prompt, gen=gen, computed_tokens=computed, max_tokens=100)
    assert remaining_prompt_tokens(r) == left
    assert (left > 0) == r.in_prefill


def test_a_decoding_request_in_the_simulator_is_costed_as_a_decode() -> None:
    """SlideBatching's exec of a request the engine is decoding is one decode step (T̃_d), not a
    one-token prefill."""
    engine = SimEngine("e", H100, make_engine_policy("fcfs"), EngineConfig())
    r = SimRequest("r", 0.0, latency(1.0), 1000, output_tokens=50, max_tokens=50)
    engine.accept(r, 0.0)
    now = 0.0
    for _ in range(4):  # the prefill, then three decodes
        end = engine.plan(now)
        assert end is not None
        engine.complete()
        now = end
    view = request_view(r)
    assert view.generated_tokens == 4 and view.computed_tokens == 1003
    assert remaining_prompt_tokens(view) == 0
    m = queue_metrics([view], now, H100, SlideBatchingParams())
    assert m.exec_s[0] == pytest.approx(decode_core_s(H100, 1003))


def _decoding(computed_offset: int) -> RequestView:
    """A streaming request 7 tokens into its output; its newest token uncomputed (offset -1: the
    engine's count) or computed (0: a state stream's)."""
    return request(
        "d", latency(1.0), prompt=500, gen=7, computed_tokens=506 + 1 + computed_offset, max_tokens=100
    )


def test_tempo_gives_a_decoding_request_no_prefill_time_whichever_count_it_sees() -> None:
    view = builders.engine(10.0, profile=H100)
    p = TempoParams()
    for densities in (service_densities, service_densities_scalar):
        engine_count, stream_count = (densities([_decoding(o)], [], view, p) for o in (-1, 0))
        assert list(engine_count.remaining_s) == list(stream_count.remaining_s)
        assert list(engine_count.throttled) == list(stream_count.throttled)


def test_slos_serve_counts_a_decoding_request_among_the_decoders_not_the_prefills() -> None:
    dp = dp_view(
        [_decoding(-1)],
        10.0,
        H100,
        SLOsServeParams(),
        kv_tokens_total=100_000,
        max_num_seqs=64,
        max_num_batched_tokens=8192,
    )
    assert dp.forced == ()
    assert len(dp.capacity.base_decoders) == 1
