"""Discrete-event simulator of vLLM engines and a routed fleet (vLLM v1 step semantics).

* :class:`slo_core.sim.engine.SimEngine`: one replica, steppable from outside (``accept``, ``plan``,
  ``complete(duration_s)`` returning a :class:`~slo_core.sim.engine_types.StepOutcome` of token
  events, ``abort``); see its module docstring for the semantics and the driving loop.
* :class:`slo_core.sim.fleet.FleetSim`: replicas behind a router policy, jobs from
  :mod:`slo_core.workloads`, compound programs released stage by stage.
* :mod:`slo_core.bench.runner` and ``slofleet bench`` (:mod:`slo_core.bench.cli`): sweeps; metrics in
  :mod:`slo_core.metrics`.
"""
