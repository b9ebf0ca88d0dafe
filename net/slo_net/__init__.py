"""The services' HTTP/1.1 client to the pods and engines they relay to (router, proxy-mode sidecar).

Shared by deployables, so it sits beside the generated stubs, below them; core stays free of I/O.
"""
