"""A local SLO-aware fleet on one machine (``slofleet up``) and the demo that compares it with a stock one.

The same processes the Helm chart runs (engines, one sidecar per engine, the router), started as
child processes of this one and wired over loopback. It lives beside the router because the router
is the fleet's front door; it imports no other service, only launches their commands.
"""
