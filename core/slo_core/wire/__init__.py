"""Contracts between slofleet's processes, each written once: every side imports these, none copies them.

* :mod:`.request_slo`: the SLO a client asks for (``x-slo-*`` headers, the body's ``slo`` object).
* :mod:`.headers`: headers the router adds for the pod (tenant, request id) and strips from clients.
* :mod:`.tags`: the SLO tags an engine request carries (``vllm_xargs``) and their encoding.
* :mod:`.k8s`: the API group, pod labels and annotations the operator writes and the router reads.
* :mod:`.openai`: OpenAI error objects and SSE framing.
* :mod:`.signing`: HMAC signatures the router side puts on engine tags and the plugin verifies.
* :mod:`.keyring`: the current/previous key pair of the chart's Secret, its rotation and live reload.
* :mod:`.callauth`: the HMAC token a gRPC call to a sidecar carries in its metadata.
* :mod:`.tokens`: the tokenizer-free token estimate used wherever text must be counted before an engine.
"""
