"""A local SLO-aware fleet on one machine (``slofleet up``) and the demo that compares it with a stock one.

The same processes the Helm chart runs (engines, one sidecar per engine, the router), started as
child processes of this one and wired over loopback. It only launches the services' commands; it
imports none of them.
"""
