"""engine-sim: an OpenAI-compatible server that behaves like a vLLM server of a given GPU profile.

Timing comes from ``slo_core.sim.engine.SimEngine`` driven in real time (see :mod:`.runner`), text
is deterministic filler and token counts follow a documented tokenizer-free rule (:mod:`.tokens`).

Command line::

    slofleet engine-sim --port 8001 [--profile NAME] [--speedup 20] [--policy gmax --policy-params '{}']
                        [--max-num-seqs 256] [--max-num-batched-tokens 8192] [--analyzer HOST:PORT]

In-process, for tests (``port=0`` picks a free port; keyword fields override ``EngineSimSettings``)::

    from slo_sidecar.engine_sim import serve_engine_sim, EngineSimThread

    async with serve_engine_sim(speedup=50, max_num_seqs=8) as sim:
        client = openai.AsyncOpenAI(base_url=sim.base_url, api_key="x")   # sim.url: http://127.0.0.1:P
        await client.completions.create(model=sim.model, prompt="hi", max_tokens=8,
                                        extra_body={"ignore_eos": True})
        sim.runner.num_running  # engine state: num_waiting, kv_usage, engine (the SimEngine)

    with EngineSimThread(speedup=50) as sim:  # the same server in a background thread (sync tests)
        ...
"""

from __future__ import annotations

from .server import EngineSimServer, EngineSimThread, serve_engine_sim
from .settings import EngineSimSettings

__all__ = ["EngineSimServer", "EngineSimSettings", "EngineSimThread", "serve_engine_sim"]
