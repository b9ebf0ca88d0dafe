"""Llama architecture shapes: weight count, KV bytes per token, and KV-cache capacity on a GPU.

KV capacity follows vLLM's memory budget: (GPU memory × TP × gpu_memory_utilization − weight bytes)
/ KV bytes per token, with bf16 weights and cache (vLLM also reserves activation memory, so its own
count is a few percent lower).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GIB = 1024**3
GPU_MEMORY_GIB = {"a100": 80, "h100": 80}
GPU_MEMORY_UTILIZATION = 0.9


@dataclass(frozen=True, slots=True)
class Shape:
    """A Llama architecture: enough to count weights and KV bytes."""

    name: str
    layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    max_model_len: int

    def params(self) -> int:
        attn = (
            2 * self.hidden * self.q_heads * self.head_dim + 2 * self.hidden * self.kv_heads * self.head_dim
        )
        mlp = 3 * self.hidden * self.ffn
        norms = 2 * self.hidden
        return self.layers * (attn + mlp + norms) + 2 * self.vocab * self.hidden + self.hidden

    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2  # K and V, bf16


LLAMA3_8B = Shape("llama3-8b", 32, 4096, 32, 8, 128, 14336, 128256, 8192)
LLAMA2_70B = Shape("llama2-70b", 80, 8192, 64, 8, 128, 28672, 32000, 4096)


def kv_capacity(shape: Shape, gpu: str, tp: int) -> tuple[int, dict[str, Any]]:
    """KV-cache tokens of ``shape`` on ``tp`` GPUs of kind ``gpu``, and how they were derived."""
    usable = GPU_MEMORY_GIB[gpu] * GIB * tp * GPU_MEMORY_UTILIZATION
    weights = shape.params() * 2
    tokens = int((usable - weights) // shape.kv_bytes_per_token())
    return tokens, {
        "formula": "(gpu_memory * tp * gpu_memory_utilization - weight_bytes) / kv_bytes_per_token",
        "gpu_memory_gib": GPU_MEMORY_GIB[gpu],
        "gpu_memory_utilization": GPU_MEMORY_UTILIZATION,
        "weight_bytes": weights,
        "params": shape.params(),
        "kv_bytes_per_token": shape.kv_bytes_per_token(),
        "note": "bf16 weights and KV cache; vLLM also reserves activation memory (a few % fewer tokens)",
    }
