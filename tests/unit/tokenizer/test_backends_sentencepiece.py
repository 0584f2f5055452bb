"""SentencePiece backend on the real Mistral models mistral-common ships (v1, v2, v3, v7): ids identical to
sentencepiece and mistral-common, decode identical to Hugging Face's conversion of the same model, special
tokens, side configuration, offsets."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import mistral_common
import pytest
import sentencepiece
from helpers.tokenizer_files import MULTILINGUAL_TEXTS, assert_offsets_map_back, reference_hf_tokenizer
from mistral_common.tokens.tokenizers.sentencepiece import SentencePieceTokenizer as MistralSentencePiece

from detok_worker.tokenizer.backends.sentencepiece import SentencePieceTokenizer, load_sentencepiece
from detok_worker.tokenizer.protocol import InvalidTokenIdError, Tokenizer

MISTRAL_DATA = Path(mistral_common.__file__).parent / "data"
MODELS = {
    "v1": "tokenizer.model.v1",
    "v2": "mistral_instruct_tokenizer_240216.model.v2",
    "v3": "mistral_instruct_tokenizer_240323.model.v3",
    "v7": "mistral_instruct_tokenizer_241114.model.v7",
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def version(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def tokenizer(version: str) -> SentencePieceTokenizer:
    return load_sentencepiece(MISTRAL_DATA / MODELS[version])


def test_ids_match_sentencepiece_and_mistral_common(version: str, tokenizer: SentencePieceTokenizer) -> None:
    assert isinstance(tokenizer, Tokenizer)
    reference = sentencepiece.SentencePieceProcessor(model_file=str(MISTRAL_DATA / MODELS[version]))
    mistral = MistralSentencePiece(str(MISTRAL_DATA / MODELS[version]))
    for text in MULTILINGUAL_TEXTS:
        encoding = tokenizer.encode(text)
        assert encoding.ids == reference.encode(text)
        assert tokenizer.encode(text, add_special_tokens=True).ids == mistral.encode(text, bos=True, eos=False)
        assert tokenizer.decode(encoding.ids) == text
        assert tokenizer.decode(encoding.ids) == mistral.decode(encoding.ids)
        assert_offsets_map_back(tokenizer, text)


def test_special_tokens(version: str, tokenizer: SentencePieceTokenizer) -> None:
    special = tokenizer.special_tokens
    assert (special.bos, special.eos, special.unk) == ("<s>", "</s>", "<unk>")
    assert tokenizer.eos_token_ids == frozenset({2})
    assert tokenizer.encode("<s>hi</s>").ids[0] == 1 and tokenizer.encode("<s>hi</s>").ids[-1] == 2
    assert {0, 1, 2} <= tokenizer.special_token_ids
    if version in ("v3", "v7"):
        ids = tokenizer.encode("[INST] hi[/INST]").ids
        assert (ids[0], ids[-1]) == (3, 4)
        assert tokenizer.decode(ids) == "[INST] hi[/INST]"
        assert tokenizer.decode(ids, skip_special_tokens=True) == "hi"
        assert tokenizer.id_to_token(3) == "[INST]" and tokenizer.token_to_id("[/INST]") == 4


def test_token_strings_agree_with_decode(tokenizer: SentencePieceTokenizer) -> None:
    anchor = tokenizer.token_to_id("a")
    assert anchor is not None
    for token_id in range(0, tokenizer.vocab_size, 7):
        token = tokenizer.id_to_token(token_id)
        assert token is not None and tokenizer.token_to_id(token) == token_id
        if token_id in tokenizer.special_token_ids or token.startswith("<0x"):
            continue
        assert tokenizer.decode([anchor, token_id]) == "a" + token.replace("▁", " ")
    assert tokenizer.token_to_id("definitely not a piece") is None
    for bad in (-1, tokenizer.vocab_size):
        with pytest.raises(InvalidTokenIdError):
            tokenizer.decode([bad])


def test_decode_matches_hugging_face_conversion_of_the_same_model() -> None:
    """mistral-sp-v1 is tokenizer.model.v1 converted by transformers. Byte-token runs that are not valid UTF-8 are
    left out: SentencePiece decodes the valid bytes of such a run, Hugging Face's ByteFallback none of them."""
    ours = load_sentencepiece(MISTRAL_DATA / MODELS["v1"])
    reference = reference_hf_tokenizer("mistral-sp-v1")
    rng = random.Random(4)
    for _ in range(3000):
        ids = [rng.choice([0, 1, 2, rng.randrange(259, 32000), rng.randrange(259, 32000)]) for _ in range(6)]
        for skip in (False, True):
            assert ours.decode(ids, skip) == reference.decode(ids, skip_special_tokens=skip), ids
    text = "héllo 🫨 wörld"
    ids = ours.encode(text).ids
    assert any(3 <= i < 259 for i in ids)  # byte fallback in play
    assert ours.decode(ids) == reference.decode(ids, skip_special_tokens=False) == text


def test_skip_special_tokens_decodes_like_sentencepiece_without_them() -> None:
    ours = load_sentencepiece(MISTRAL_DATA / MODELS["v1"])
    reference = sentencepiece.SentencePieceProcessor(model_file=str(MISTRAL_DATA / MODELS["v1"]))
    rng = random.Random(5)
    for _ in range(3000):
        ids = [rng.choice([0, 1, 2, rng.randrange(3, 259), rng.randrange(32000)]) for _ in range(8)]
        assert ours.decode(ids, skip_special_tokens=True) == reference.decode([i for i in ids if i > 2]), ids


def test_side_configuration_adds_tokens_and_eos_ids(tmp_path: Path) -> None:
    shutil.copy(MISTRAL_DATA / MODELS["v1"], tmp_path / "tokenizer.model")
    config = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "add_bos_token": False,
        "added_tokens_decoder": {"32000": {"content": "<pad>", "special": True}},
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 32000]}))
    tokenizer = load_sentencepiece(tmp_path / "tokenizer.model")
    assert tokenizer.vocab_size == 32001
    assert tokenizer.special_tokens.pad == "<pad>"
    assert tokenizer.eos_token_ids == frozenset({2, 32000})
    assert tokenizer.encode("hi<pad>", add_special_tokens=True).ids[-1] == 32000
    assert tokenizer.encode("hi", add_special_tokens=True).ids[0] != 1  # add_bos_token: false
    assert tokenizer.decode([6312, 28709, 32000]) == "hello<pad>"
    assert tokenizer.decode([6312, 28709, 32000], skip_special_tokens=True) == "hello"


@pytest.mark.parametrize("version", ["v3", "v7"])
def test_mistral_common_chat_prompt_round_trips(version: str) -> None:
    """The ids mistral-common builds for a chat decode to a prompt string that encodes back to the same ids."""
    from mistral_common.protocol.instruct.messages import AssistantMessage, UserMessage
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    mistral = MistralTokenizer.from_file(str(MISTRAL_DATA / MODELS[version]))
    messages = [UserMessage(content="hi there 你好"), AssistantMessage(content="ok 🫨"), UserMessage(content="again")]
    ids = mistral.encode_chat_completion(ChatCompletionRequest(messages=messages)).tokens
    tokenizer = load_sentencepiece(MISTRAL_DATA / MODELS[version])
    prompt = tokenizer.decode(ids)
    assert prompt == "<s>[INST] hi there 你好[/INST] ok 🫨</s>[INST] again[/INST]"
    assert tokenizer.encode(prompt).ids == ids
