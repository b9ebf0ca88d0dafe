"""Performance model: per-iteration batch latency fitted from GPU profiles, with online correction."""

from slo_core.perf.model import OnlineCorrection, PerfProfile, sped_up
from slo_core.perf.profiles import list_profiles, load_profile

__all__ = ["OnlineCorrection", "PerfProfile", "list_profiles", "load_profile", "sped_up"]
