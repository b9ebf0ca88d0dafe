"""Build a tiny random-weight Llama with a locally trained byte-level BPE tokenizer (no hub needed).

Run inside the vLLM virtual environment (needs torch, transformers, tokenizers). About 10 s.
"""

from __future__ import annotations

import json
import sys
import sysconfig
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _corpus() -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = []
    for path in sorted(stdlib.glob("*.py"))[:60]:
        texts.append(path.read_text(encoding="utf-8", errors="ignore"))
    return texts


def build(out_dir: Path, vocab_size: int = 4096) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out_dir.mkdir(parents=True, exist_ok=True)
    if (out_dir / "config.json").exists():
        return out_dir
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "</s>", "<unk>", "<pad>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False)
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=fast.vocab_size if len(fast) <= fast.vocab_size else len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        torch_dtype="float32",
    )
    LlamaForCausalLM(config).save_pretrained(out_dir)
    (out_dir / "slofleet-tiny.json").write_text(json.dumps({"built_by": "tests/support/tiny_model.py"}))
    return out_dir


if __name__ == "__main__":
    print(build(Path(sys.argv[1])))
