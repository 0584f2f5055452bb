"""Token strings (logprobs' `token`, prompt logprobs' `decoded_token`): the decode of one id alone, with the leading
spaces a Metaspace tokenizer's decode strips put back, as vLLM's `convert_ids_list_to_tokens` gives them."""

from __future__ import annotations

from helpers.fixtures import load_fixture_tokenizer

from detok_worker.tokenizer.token_strings import token_string, word_start_marker


def strings(name: str, ids: list[int]) -> list[str]:
    tokenizer = load_fixture_tokenizer(name)
    marker = word_start_marker(tokenizer)
    return [token_string(tokenizer, token_id, tokenizer.decode([token_id]), marker) for token_id in ids]


def test_a_metaspace_word_piece_keeps_its_leading_space() -> None:
    mistral = load_fixture_tokenizer("mistral-sp-v1")
    assert word_start_marker(mistral) == "\u2581"
    hello, space, newline = (
        mistral.encode("Hello").ids[-1],
        mistral.token_to_id("\u2581"),
        mistral.token_to_id("<0x0A>"),
    )
    assert mistral.id_to_token(hello) == "\u2581Hello" and mistral.decode([hello]) == "Hello"
    assert strings("mistral-sp-v1", [hello, space, newline, mistral.token_to_id("The")]) == [" Hello", " ", "\n", "The"]
    assert strings("mistral-sp-v1", [mistral.token_to_id("<s>")]) == ["<s>"]


def test_byte_level_tokenizers_keep_their_decode() -> None:
    qwen3 = load_fixture_tokenizer("qwen3")
    assert word_start_marker(qwen3) is None
    ids = qwen3.encode(" Hello world 你好").ids
    assert strings("qwen3", ids) == [qwen3.decode([token_id]) for token_id in ids]
    assert word_start_marker(load_fixture_tokenizer("gpt4o")) is None
