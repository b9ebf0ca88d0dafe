"""The engine-level policy hook of engine-sim: the same contract as the vLLM scheduler plugin.

The simulated engine (``slo_core.sim.engine.SimEngine``) calls the policy at frame boundaries and
applies its Decision with ``slo_core.policies.apply``. Around it sits core's degrade-to-stock guard
(``slo_core.policies.guard.GuardedPolicy``), the one the plugin and the sidecar use too: a policy error
or an analyzer that stopped answering degrades that frame to stock order. The analyzer's output-length
bounds are written into the engine's requests before each step (``runner``).
"""

from __future__ import annotations

from slo_core.policies.guard import GuardedPolicy, observes_feedback

__all__ = ["GuardedPolicy", "observes_feedback"]
