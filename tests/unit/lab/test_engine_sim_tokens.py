"""engine-sim's tokenizer-free counting rule, filler text and prompt-drawn output lengths."""

from __future__ import annotations

import statistics

import pytest

from slo_lab.engine_sim import tokens


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ("", 0),
        ("   \n\t ", 0),
        ("Hello, world!", 4),
        ("internationalization", 3),  # word runs are cut every 8 characters
        ("a+b=c", 5),
        ("don't", 3),
        ("3.14159", 3),
    ],
)
def test_counting_rule(text: str, count: int) -> None:
    assert tokens.count_text_tokens(text, add_special_tokens=False) == count
    assert tokens.count_text_tokens(text) == count + 1  # BOS
    ids = tokens.token_ids(text)
    assert len(ids) == count + 1 and ids[0] == tokens.BOS_ID
    assert all(0 <= i < tokens.VOCAB_SIZE for i in ids)


def test_token_ids_are_stable_and_piece_wise() -> None:
    assert tokens.token_ids("queue queue", add_special_tokens=False) == [tokens.token_ids("queue")[1]] * 2
    assert tokens.token_ids("alpha") != tokens.token_ids("beta")


def test_chat_count_matches_chat_ids() -> None:
    chat = [("system", "Be brief."), ("user", "What is a KV cache?")]
    n = tokens.count_chat_tokens(chat)
    assert n == len(tokens.chat_token_ids(chat))
    content = sum(tokens.count_text_tokens(t, add_special_tokens=False) for _, t in chat)
    assert n == 1 + content + 2 * tokens.CHAT_TOKENS_PER_MESSAGE + tokens.CHAT_TOKENS_ASSISTANT_HEADER


def test_filler_recounts_to_its_length_and_continues_seamlessly() -> None:
    key = tokens.prompt_key("tell me a story")
    words = tokens.filler_words(key, 120)
    assert tokens.count_text_tokens("".join(words), add_special_tokens=False) == 120
    assert tokens.filler_words(key, 5, start=30) == words[30:35]
    assert tokens.filler_words(tokens.prompt_key([1, 2, 3]), 3) == tokens.filler_words(
        tokens.prompt_key([1, 2, 3]), 3
    )


def test_natural_lengths_are_deterministic_and_follow_the_shipped_distribution() -> None:
    dist = tokens.output_length_distribution()
    assert len(dist) == 5000 and dist == tuple(sorted(dist)) and dist[0] >= 1
    key = tokens.prompt_key("same prompt")
    assert tokens.natural_output_tokens(key) == tokens.natural_output_tokens(key)
    drawn = [tokens.natural_output_tokens(tokens.prompt_key(f"prompt {i}")) for i in range(2000)]
    assert set(drawn) <= set(dist)
    assert len(set(drawn)) > 200  # a spread of lengths, not a constant
    # the draw's median sits near the data's median (ShareGPT answers: a few hundred tokens)
    true_median = statistics.median(dist)
    assert 0.8 * true_median < statistics.median(drawn) < 1.25 * true_median
