"""The Hugging Face backend and the factory, on the real fixture tokenizers."""

from __future__ import annotations

import json
import lzma
import shutil
from pathlib import Path

import pytest
from helpers.fixtures import FIXTURE_TOKENIZER_DIRS, load_fixture_tokenizer

from detok_worker.tokenizer import (
    DEFAULT_TOKENIZER_DIR,
    Encoding,
    InvalidTokenIdError,
    Tokenizer,
    TokenizerLoadError,
    create_tokenizer,
    load_default_tokenizer,
)

SAMPLE = "Hello, world! Ünïcödé 你好 🤗 def f(x):\n    return x ** 2\n"


def _tokenizer_json(name: str) -> dict:
    return json.loads(lzma.decompress((FIXTURE_TOKENIZER_DIRS[name] / "tokenizer.json.xz").read_bytes()))


def _config(name: str) -> dict:
    return json.loads((FIXTURE_TOKENIZER_DIRS[name] / "tokenizer_config.json").read_text())


def test_implements_protocol_and_vocab_size_counts_added_tokens(fixture_tokenizer_name: str) -> None:
    tokenizer = load_fixture_tokenizer(fixture_tokenizer_name)
    assert isinstance(tokenizer, Tokenizer)
    data = _tokenizer_json(fixture_tokenizer_name)
    ids = list(data["model"]["vocab"].values()) + [t["id"] for t in data["added_tokens"]]
    assert tokenizer.vocab_size == max(ids) + 1


def test_encode_decode_round_trip_with_offsets(fixture_tokenizer_name: str) -> None:
    tokenizer = load_fixture_tokenizer(fixture_tokenizer_name)
    encoding = tokenizer.encode("Hello world, this is plain ASCII.")
    assert isinstance(encoding, Encoding)
    assert len(encoding.offsets) == len(encoding.ids) > 3
    text = "Hello world, this is plain ASCII."
    # Offsets are character spans of the text, in order, ending at its end.
    assert encoding.offsets[-1][1] == len(text)
    starts = [start for start, _ in encoding.offsets]
    assert starts == sorted(starts) and all(0 <= s < e <= len(text) for s, e in encoding.offsets)
    assert text[slice(*encoding.offsets[1])].strip() == tokenizer.decode(encoding.ids[1:2]).strip()
    assert tokenizer.decode(tokenizer.encode(SAMPLE).ids).strip() == SAMPLE.strip()
    batch = tokenizer.encode_batch([SAMPLE, "x"])
    assert [e.ids for e in batch] == [tokenizer.encode(SAMPLE).ids, tokenizer.encode("x").ids]


def test_special_tokens_follow_tokenizer_json_and_config(fixture_tokenizer_name: str) -> None:
    tokenizer = load_fixture_tokenizer(fixture_tokenizer_name)
    data = _tokenizer_json(fixture_tokenizer_name)
    assert tokenizer.special_token_ids == {t["id"] for t in data["added_tokens"] if t["special"]}
    eos = _config(fixture_tokenizer_name)["eos_token"]
    eos = eos["content"] if isinstance(eos, dict) else eos
    assert tokenizer.special_tokens.eos == eos
    assert tokenizer.eos_token_ids == {tokenizer.token_to_id(eos)}
    special_id = min(tokenizer.special_token_ids)
    ids = [special_id, *tokenizer.encode("plain words").ids]
    kept = tokenizer.decode(ids)
    assert tokenizer.id_to_token(special_id) in kept
    assert tokenizer.id_to_token(special_id) not in tokenizer.decode(ids, skip_special_tokens=True)


def test_token_to_id_and_id_to_token_are_inverse(fixture_tokenizer_name: str) -> None:
    tokenizer = load_fixture_tokenizer(fixture_tokenizer_name)
    for token_id in (0, 1, 100, tokenizer.vocab_size - 1):
        token = tokenizer.id_to_token(token_id)
        assert token is not None and tokenizer.token_to_id(token) == token_id
    assert tokenizer.id_to_token(-1) is None
    assert tokenizer.id_to_token(tokenizer.vocab_size) is None
    assert tokenizer.token_to_id("\x00surely not a token\x00") is None


@pytest.mark.parametrize("offset", [-1, 0, 10**9])
def test_decode_rejects_ids_outside_the_vocabulary(offset: int) -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    bad = offset if offset < 0 else tokenizer.vocab_size + offset
    with pytest.raises(InvalidTokenIdError) as info:
        tokenizer.decode([9707, bad])
    assert info.value.token_id == bad
    assert str(bad) in str(info.value)
    with pytest.raises(InvalidTokenIdError):
        tokenizer.decode_batch([[9707], [bad]])


def test_factory_accepts_file_directory_and_plain_json(tmp_path: Path) -> None:
    source = FIXTURE_TOKENIZER_DIRS["mistral-sp-v1"]
    from_dir = create_tokenizer(source)
    from_xz_file = create_tokenizer(source / "tokenizer.json.xz")
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "tokenizer.json").write_bytes(lzma.decompress((source / "tokenizer.json.xz").read_bytes()))
    from_plain_dir = create_tokenizer(str(plain))
    ids = from_dir.encode(SAMPLE).ids
    assert from_xz_file.decode(ids) == from_plain_dir.decode(ids) == from_dir.decode(ids)
    assert from_dir.name == "mistral-sp-v1"
    # Without tokenizer_config.json the special-token names are unknown, but the ids still are.
    assert from_plain_dir.special_tokens.eos is None and from_plain_dir.special_token_ids == from_dir.special_token_ids


def test_generation_config_adds_eos_ids(tmp_path: Path) -> None:
    shutil.copytree(FIXTURE_TOKENIZER_DIRS["qwen3"], tmp_path / "qwen3")
    (tmp_path / "qwen3" / "generation_config.json").write_text(json.dumps({"eos_token_id": [151643, 151645]}))
    tokenizer = create_tokenizer(tmp_path / "qwen3")
    assert tokenizer.eos_token_ids == {151643, 151645}
    assert tokenizer.id_to_token(151643) == "<|endoftext|>"


def test_factory_errors_are_typed(tmp_path: Path) -> None:
    with pytest.raises(TokenizerLoadError, match="no such file"):
        create_tokenizer(tmp_path / "missing")
    with pytest.raises(TokenizerLoadError, match="tokenizer.json"):
        create_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"not": "a tokenizer"}')
    with pytest.raises(TokenizerLoadError, match="not a valid"):
        create_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_bytes(b"\xff\xfe garbage")
    with pytest.raises(TokenizerLoadError):
        create_tokenizer(tmp_path / "tokenizer.json")
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    with pytest.raises(TokenizerLoadError, match="not a supported tokenizer"):
        create_tokenizer(other)


def test_default_tokenizer_is_the_embedded_qwen3() -> None:
    tokenizer = load_default_tokenizer()
    assert DEFAULT_TOKENIZER_DIR.is_dir()
    assert tokenizer.name == "qwen3"
    assert tokenizer.vocab_size == load_fixture_tokenizer("qwen3").vocab_size
    assert tokenizer.chat_templates.templates == {"default": _config("qwen3")["chat_template"]}


def test_chat_template_renders_from_config() -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert rendered.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert load_fixture_tokenizer("mistral-sp-v1").chat_templates is None
