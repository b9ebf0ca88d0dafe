"""engine-sim: an OpenAI-compatible server that behaves like a vLLM server of a given GPU profile.

Timing comes from ``slo_core.sim.engine.SimEngine`` driven in real time (see :mod:`.runner`), text
is deterministic filler and token counts follow a documented tokenizer-free rule (:mod:`.tokens`).

Command line::

    slofleet engine-sim --port 8001 [--profile NAME] [--speedup 20] [--policy gmax --policy-params '{}']
                        [--max-num-seqs 256] [--max-num-batched-tokens 8192] [--analyzer HOST:PORT]

In-process, for tests (``port=0`` picks a free port; keyword fields override ``EngineSimSettings``)::

    from slo_lab.engine_sim import serve_engine_sim, EngineSimThread

    async with serve_engine_sim(speedup=50, max_num_seqs=8) as sim:
        client = openai.AsyncOpenAI(base_url=sim.base_url, api_key="x")   # sim.url: http://127.0.0.1:P
        await client.completions.create(model=sim.model, prompt="hi", max_tokens=8,
                                        extra_body={"ignore_eos": True})
        sim.runner.num_running  # engine state: num_waiting, kv_usage, engine (the SimEngine)

    with EngineSimThread(speedup=50) as sim:  # the same server in a background thread (sync tests)
        ...

Behaviour worth knowing:

* ``--speedup X`` simulates a GPU X times faster (every profile coefficient divided by X); the clock
  stays Unix time, so SLO tags, metrics and client timings are all wall-clock seconds.
* Output length: exactly ``max_tokens`` with ``ignore_eos``; otherwise the prompt's hash picks a
  length from the ShareGPT output-length distribution (``finish_reason`` ``stop``), capped by
  ``max_tokens`` (``length``), at least ``min_tokens``. A continuation sent as token ids draws anew.
* A request the policy rejects, a client that disconnects, and a stopped or crashed engine end the
  request with ``finish_reason: "abort"`` (counted under ``vllm:request_success_total``); a crashed
  engine then answers 503 on ``/health`` and on new requests.
* ``priority`` orders the waiting queue only with ``--scheduling-policy priority`` (lower first), as
  in vLLM; ``vllm_xargs`` carries slofleet's SLO tags (malformed tags: 400). Sampling fields
  (temperature, top_p, stop, logprobs, seed, ...) are accepted and ignored; ``n > 1`` and several
  prompts per request are 400s.
* Streams send one chunk per token; tokens that piled up for a slow client go in one chunk.
"""

from __future__ import annotations

from .server import EngineSimServer, EngineSimThread, serve_engine_sim
from .settings import EngineSimSettings

__all__ = ["EngineSimServer", "EngineSimSettings", "EngineSimThread", "serve_engine_sim"]
