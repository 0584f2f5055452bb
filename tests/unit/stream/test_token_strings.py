"""Token strings (logprobs' `token`, prompt logprobs' `decoded_token`), as vLLM 0.32 gives them: the decode of one
id alone, with the leading spaces a Metaspace tokenizer's decode strips put back (`convert_ids_list_to_tokens`), and a
token holding part of a character completed from the tokens before it (its logprobs processor)."""

from __future__ import annotations

from helpers.fixtures import load_fixture_tokenizer

from detok_worker.stream.decode.token_strings import TokenStrings, word_start_marker


def test_a_metaspace_word_piece_keeps_its_leading_space() -> None:
    mistral = load_fixture_tokenizer("mistral-sp-v1")
    strings = TokenStrings(mistral)
    assert word_start_marker(mistral) == "\u2581"
    hello = mistral.encode("Hello").ids[-1]
    assert mistral.id_to_token(hello) == "\u2581Hello" and mistral.decode([hello]) == "Hello"
    ids = [hello, mistral.token_to_id("\u2581"), mistral.token_to_id("<0x0A>"), mistral.token_to_id("The")]
    assert [strings.of(token_id) for token_id in ids] == [" Hello", " ", "\n", "The"]
    assert strings.of(mistral.token_to_id("<s>")) == "<s>"


def test_byte_level_tokenizers_keep_their_decode() -> None:
    qwen3 = load_fixture_tokenizer("qwen3")
    assert word_start_marker(qwen3) is None and word_start_marker(load_fixture_tokenizer("gpt4o")) is None
    ids = qwen3.encode(" Hello world 你好").ids
    assert [TokenStrings(qwen3).of(token_id) for token_id in ids] == [qwen3.decode([token_id]) for token_id in ids]


def test_the_pieces_of_a_character_give_nothing_then_the_whole_character() -> None:
    for name, text in [("qwen3", "a 🪼 今天"), ("mistral-sp-v1", "a 🪼 b")]:
        tokenizer = load_fixture_tokenizer(name)
        strings = TokenStrings(tokenizer)
        ids = tokenizer.encode(text).ids
        placed = [strings.at(token_id, ids[:i]) for i, token_id in enumerate(ids)]
        alone = [strings.of(token_id) for token_id in ids]
        assert sum(string.endswith("\ufffd") for string in alone) >= 2, name  # the jellyfish is split
        assert "".join(placed).lstrip(" ") == text, name
        for string, lone in zip(placed, alone, strict=True):
            assert string == lone or (lone.endswith("\ufffd") and string in ("", "🪼", " 🪼")), name
    qwen3 = load_fixture_tokenizer("qwen3")
    first = qwen3.encode("🪼").ids[0]
    assert TokenStrings(qwen3).at(first, []) == ""  # nothing before it to complete it with


def test_ids_the_tokenizer_lacks_decode_to_nothing() -> None:
    qwen3 = load_fixture_tokenizer("qwen3")
    strings = TokenStrings(qwen3)
    lacking = qwen3.vocab_size + 5
    assert strings.of(lacking) == ""
    ids = qwen3.encode("🪼").ids
    assert 2 <= len(ids) <= 3
    assert strings.at(ids[-1], [*ids[:-1], lacking]) == "🪼"  # the lacking id in between is left out
