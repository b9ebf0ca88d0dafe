"""Headers the router sets on the request it forwards to a pod; a client may never set them itself."""

from __future__ import annotations

INTERNAL_PREFIX = "x-slofleet-"  # every header under it is stripped from client requests at the router
TENANT_HEADER = INTERNAL_PREFIX + "tenant"  # the tenant the router authenticated the request as
REQUEST_ID_HEADER = "x-request-id"
