"""The chunks and bodies the client receives: SSE framing, the usage chunk, the assembled answer.

Usage is the sidecar's own sum over attempts (:mod:`slo_sidecar.attempt` runs each attempt): the
prompt as the client sent it, every completion token of every attempt.
"""

from __future__ import annotations

from typing import Any

from slo_core.wire import openai
from slo_sidecar.front import CHAT
from slo_sidecar.job import Job


def usage_of(job: Job) -> dict[str, int]:
    prompt = job.engine_prompt_tokens or job.live.prompt_tokens
    out = job.live.generated_tokens
    return {"prompt_tokens": prompt, "completion_tokens": out, "total_tokens": prompt + out}


def sse(obj: dict[str, Any]) -> bytes:
    return openai.sse_json(obj)


def usage_chunk(job: Job) -> dict[str, Any]:
    chat = job.parsed.endpoint == CHAT
    return {
        "id": job.stream_id or ("chatcmpl-" if chat else "cmpl-") + job.request_id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": job.created_unix_s,
        "model": job.parsed.model,
        "choices": [],
        "usage": usage_of(job),
    }


def full_response(job: Job) -> dict[str, Any]:
    """The non-streaming answer assembled from the streamed attempts."""
    text = "".join(job.live.generated_text)
    common = {"created": job.created_unix_s, "model": job.parsed.model, "usage": usage_of(job)}
    if job.parsed.endpoint == CHAT:
        message = {"role": "assistant", "content": text}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": job.finish_reason}
        return {
            "id": "chatcmpl-" + job.request_id,
            "object": "chat.completion",
            "choices": [choice],
            **common,
        }
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": job.finish_reason}
    return {"id": "cmpl-" + job.request_id, "object": "text_completion", "choices": [choice], **common}
