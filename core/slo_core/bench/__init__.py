"""Sweeps over the simulator (``slofleet bench``): the runner and its command line, above sim and metrics."""
