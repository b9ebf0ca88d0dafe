"""slofleet's shared, pure core: SLO model, goodput functions, performance model, policies, simulator."""

__version__ = "0.1.0"
