"""Python tokenizers: mistral-common Tekken files, custom `module:Class` tokenizers (subclass and duck-typed),
transformers-style objects (what SGLang/vLLM get_tokenizer return), and their errors."""

from __future__ import annotations

import json
import random
import shutil
import textwrap
from pathlib import Path

import mistral_common
import pytest
from helpers.fixtures import FIXTURE_TOKENIZER_DIRS
from helpers.tokenizer_files import (
    MULTILINGUAL_TEXTS,
    assert_offsets_map_back,
    fixture_tokenizer_json,
    reference_hf_tokenizer,
)
from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy
from mistral_common.tokens.tokenizers.tekken import Tekkenizer

from detok_worker.tokenizer.backends.mistral import TekkenTokenizer
from detok_worker.tokenizer.backends.python import (
    ENGINE_GET_TOKENIZER,
    load_engine_tokenizer,
    load_python_class,
    wrap_python_tokenizer,
)
from detok_worker.tokenizer.base import token_string_to_bytes
from detok_worker.tokenizer.protocol import InvalidTokenIdError, Tokenizer, TokenizerLoadError

MISTRAL_DATA = Path(mistral_common.__file__).parent / "data"
TEKKEN_FILES = ["tekken_240718.json", "tekken_240911.json"]


@pytest.fixture(scope="module", params=TEKKEN_FILES)
def tekken_pair(request: pytest.FixtureRequest) -> tuple[TekkenTokenizer, Tekkenizer]:
    path = MISTRAL_DATA / request.param
    return TekkenTokenizer(path), Tekkenizer.from_file(str(path))


def test_tekken_ids_and_text_match_mistral_common(tekken_pair: tuple[TekkenTokenizer, Tekkenizer]) -> None:
    ours, reference = tekken_pair
    assert isinstance(ours, Tokenizer)
    for text in MULTILINGUAL_TEXTS:
        encoding = ours.encode(text)
        assert encoding.ids == reference.encode(text, bos=False, eos=False)
        assert ours.encode(text, add_special_tokens=True).ids == reference.encode(text, bos=True, eos=False)
        assert ours.decode(encoding.ids) == text
        assert_offsets_map_back(ours, text)
    rng = random.Random(7)
    for _ in range(2000):
        ids = [rng.choice([1, 2, 3, 4, rng.randrange(1000, 131072), rng.randrange(1000, 131072)]) for _ in range(6)]
        assert ours.decode(ids) == reference.decode(ids, SpecialTokenPolicy.KEEP)
        assert ours.decode(ids, skip_special_tokens=True) == reference.decode(ids, SpecialTokenPolicy.IGNORE)


def test_tekken_special_tokens_and_token_strings(tekken_pair: tuple[TekkenTokenizer, Tekkenizer]) -> None:
    ours, reference = tekken_pair
    special = ours.special_tokens
    assert (special.bos, special.eos, special.unk, special.pad) == ("<s>", "</s>", "<unk>", "<pad>")
    assert ours.eos_token_ids == frozenset({reference.eos_id}) == frozenset({2})
    assert ours.special_token_ids == frozenset(range(reference.num_special_tokens))
    ids = ours.encode("<s>[INST] hi[/INST]").ids
    assert (ids[0], ids[1], ids[-1]) == (1, 3, 4)
    assert ours.decode(ids, skip_special_tokens=True) == " hi"
    for token_id in [0, 3, *range(1000, 131072, 113)]:
        token = ours.id_to_token(token_id)
        assert ours.token_to_id(token) == token_id
        if token_id >= 1000:
            assert ours.decode([token_id]) == token_string_to_bytes(token).decode("utf-8", errors="replace")
    with pytest.raises(InvalidTokenIdError):
        ours.decode([131072])


def test_tekken_bad_file_is_a_load_error(tmp_path: Path) -> None:
    (tmp_path / "tekken.json").write_text('{"config": {}, "vocab": []}')
    with pytest.raises(TokenizerLoadError, match="Tekken"):
        TekkenTokenizer(tmp_path / "tekken.json")


CUSTOM_MODULE = '''
from detok_worker.tokenizer.protocol import Encoding, SpecialTokens
from detok_worker.tokenizer.backends.python import PythonTokenizer


class CodepointTokenizer(PythonTokenizer):
    """One token per code point below 0x3000; id 0x3000 is <eos>."""

    def __init__(self, greeting="hi"):
        super().__init__(name="codepoints", vocab_size=0x3001, special_tokens=SpecialTokens(eos="<eos>"),
                         special_token_ids=[0x3000], eos_token_ids=[0x3000],
                         chat_template="{% for m in messages %}{{ m.content }}{% endfor %}" + greeting)

    def encode(self, text, add_special_tokens=False):
        ids = [ord(c) for c in text]
        return Encoding(ids=ids, offsets=[(i, i + 1) for i in range(len(ids))])

    def decode(self, ids, skip_special_tokens=False):
        return "".join("" if i == 0x3000 and skip_special_tokens else "<eos>" if i == 0x3000 else chr(i) for i in ids)


class ByteListTokenizer:
    """Duck-typed: encode returns a plain list of byte ids, with token_bytes."""

    vocab_size = 256
    eos_token_ids = frozenset()

    def encode(self, text, add_special_tokens=False):
        return list(text.encode())

    def decode(self, ids, skip_special_tokens=False):
        return bytes(ids).decode("utf-8", errors="replace")

    def token_bytes(self, token_id):
        return bytes([token_id])


class WordListTokenizer:
    """Duck-typed without token_bytes: offsets come from prefix decoding."""

    vocab_size = 3
    words = ["ab", "c", "é"]

    def encode(self, text, add_special_tokens=False):
        ids, i = [], 0
        while i < len(text):
            word = next(w for w in self.words if text.startswith(w, i))
            ids.append(self.words.index(word))
            i += len(word)
        return ids

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.words[i] for i in ids)


class NotATokenizer:
    pass


class Exploding:
    def __init__(self):
        raise RuntimeError("boom")
'''


@pytest.fixture
def custom_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "my_tokenizers.py").write_text(textwrap.dedent(CUSTOM_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_tokenizers"


def test_custom_subclass(custom_module: str) -> None:
    tokenizer = load_python_class(f"{custom_module}:CodepointTokenizer", {"greeting": "!"})
    assert isinstance(tokenizer, Tokenizer)
    assert tokenizer.encode("héllo").ids == [104, 233, 108, 108, 111]
    assert tokenizer.decode([104, 0x3000], skip_special_tokens=True) == "h"
    assert tokenizer.eos_token_ids == frozenset({0x3000})
    assert tokenizer.apply_chat_template([{"role": "user", "content": "yo"}]) == "yo!"
    with pytest.raises(InvalidTokenIdError):
        tokenizer.decode([0x3001])


def test_duck_typed_objects_get_offsets(custom_module: str) -> None:
    byte_level = load_python_class(f"{custom_module}:ByteListTokenizer")
    encoding = byte_level.encode("a🫨b")
    assert encoding.ids == list("a🫨b".encode())
    assert encoding.offsets == [(0, 1), (1, 2), (1, 2), (1, 2), (1, 2), (2, 3)]
    assert byte_level.token_bytes_table().pieces[65] == b"A"
    words = load_python_class(f"{custom_module}:WordListTokenizer")
    encoding = words.encode("abcéab")
    assert encoding.ids == [0, 1, 2, 0]
    assert encoding.offsets == [(0, 2), (2, 3), (3, 4), (4, 6)]
    assert words.encode_batch(["c", "ab"])[1].ids == [0]


def test_bad_python_specs(custom_module: str) -> None:
    with pytest.raises(TokenizerLoadError, match="does not implement"):
        load_python_class(f"{custom_module}:NotATokenizer")
    with pytest.raises(TokenizerLoadError, match="boom"):
        load_python_class(f"{custom_module}:Exploding")
    with pytest.raises(TokenizerLoadError, match="cannot import"):
        load_python_class(f"{custom_module}:Missing")
    with pytest.raises(TokenizerLoadError, match="cannot import"):
        load_python_class("no_such_module_xyz:Thing")


def test_transformers_objects_are_wrapped(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    (tmp_path / "tokenizer.json").write_text(fixture_tokenizer_json("qwen3"))
    shutil.copy(FIXTURE_TOKENIZER_DIRS["qwen3"] / "tokenizer_config.json", tmp_path / "tokenizer_config.json")
    inner = AutoTokenizer.from_pretrained(str(tmp_path))
    tokenizer = wrap_python_tokenizer(inner, name="qwen3-transformers")
    reference = reference_hf_tokenizer("qwen3")
    for text in MULTILINGUAL_TEXTS:
        assert tokenizer.encode(text).ids == reference.encode(text, add_special_tokens=False).ids
        assert_offsets_map_back(tokenizer, text)
    assert tokenizer.special_tokens.eos == "<|im_end|>"
    assert tokenizer.eos_token_ids == frozenset({151645})
    assert tokenizer.token_to_id("<|im_start|>") == 151644
    messages = [{"role": "user", "content": "hi"}]
    expected = inner.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert tokenizer.apply_chat_template(messages, add_generation_prompt=True) == expected
    assert json.dumps(expected)  # a plain string


def test_engine_tokenizers_need_their_engine() -> None:
    import importlib.util

    for engine in ENGINE_GET_TOKENIZER:
        if importlib.util.find_spec(engine) is None:
            with pytest.raises(TokenizerLoadError, match=f"needs {engine} installed"):
                load_engine_tokenizer(engine, "Qwen/Qwen3-8B")
    with pytest.raises(TokenizerLoadError, match="unknown engine"):
        load_engine_tokenizer("tgi", "x")
