"""Hugging Face `tokenizers` backend: a tokenizer.json (optionally xz-compressed) plus its tokenizer_config.json.

decode is exactly `tokenizers.Tokenizer.decode` (no transformers-side `clean_up_tokenization_spaces`, which is not
prefix-stable and so cannot be streamed); ids are validated first, because `tokenizers` silently drops unknown ids.
"""

from __future__ import annotations

import hashlib
import json
import logging
import lzma
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from itertools import chain
from pathlib import Path
from typing import Any

from tokenizers import Encoding as RustEncoding
from tokenizers import Tokenizer as RustTokenizer
from tokenizers import __version__ as tokenizers_version

from detok_worker.tokenizer.backends.hf_tiktoken import TiktokenEncoder
from detok_worker.tokenizer.backends.hf_token_bytes import hf_token_bytes_table
from detok_worker.tokenizer.base import TokenizerBase
from detok_worker.tokenizer.chat.source import templates_from_config
from detok_worker.tokenizer.loading import load_cache
from detok_worker.tokenizer.loading.load_cache import VocabFacts
from detok_worker.tokenizer.loading.side_files import json_ids, read_json_file, token_text
from detok_worker.tokenizer.protocol import (
    SPECIAL_TOKEN_ROLES,
    Encoding,
    SpecialTokens,
    TokenizerLoadError,
    is_count,
)
from detok_worker.tokenizer.token_bytes import TokenBytesTable

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.json.xz")
CONFIG_FILE = "tokenizer_config.json"
# tokenizers' encode holds the GIL for the whole text (a long one stops every other thread for seconds);
# encode_batch releases it while it works, so longer texts go through it (same pipeline, same ids).
GIL_FREE_ENCODE_CHARS = 4096
GENERATION_CONFIG_FILE = "generation_config.json"

log = logging.getLogger(__name__)


class HFTokenizer(TokenizerBase):
    """A `tokenizers.Tokenizer` implementing detok_worker.tokenizer.protocol.Tokenizer (TokenizerBase holds the
    vocabulary size, special-token sets and chat templates; encoding, decoding and id checks are the library's)."""

    def __init__(
        self,
        tokenizer: RustTokenizer | None,
        *,
        name: str,
        config: Mapping[str, Any] | None = None,
        generation_config: Mapping[str, Any] | None = None,
        source_digest: str | None = None,
        vocab_facts: VocabFacts | None = None,
        build: Callable[[], RustTokenizer] | None = None,
    ) -> None:
        """`tokenizer` is the library tokenizer; or None with `build` and `vocab_facts`: it is then built at its
        first use (everything this constructor and the vocabulary-wide methods need comes from the facts)."""
        if tokenizer is not None:
            self._tokenizer = tokenizer
        elif build is None or vocab_facts is None:
            raise ValueError("HFTokenizer needs a library tokenizer, or a way to build one and its vocabulary facts")
        self._build = build
        self._build_lock = threading.Lock()
        self._tiktoken_encoder: TiktokenEncoder | None = None
        self._encoder_lock = threading.Lock()
        self._encoder_tried = False
        self._source_digest = source_digest  # sha256 of the tokenizer.json it was loaded from, if known
        config = config or {}
        facts = vocab_facts if vocab_facts is not None else read_vocab_facts(self._tokenizer)
        vocab_size = facts.vocab_size
        self._word_start_marker = facts.word_start_marker
        added = {token_id: (content, special) for token_id, content, special in facts.added_tokens}
        contents = [content for content, _ in added.values()]
        named = Counter(contents)
        # The library looks a token up among the added tokens first (then in the model): the same answer here,
        # without building it, for a content that names one added token.
        self._added_ids = {content: i for i, (content, _) in added.items() if named[content] == 1}
        self._added_contents = {i: content for i, (content, _) in added.items()}
        special_tokens = self._read_special_tokens(config, contents, added)
        eos_ids = list(json_ids((generation_config or {}).get("eos_token_id")))
        if special_tokens.eos is not None and (eos_id := self.token_to_id(special_tokens.eos)) is not None:
            eos_ids.append(eos_id)
        super().__init__(
            name=name,
            vocab_size=vocab_size,
            special_tokens=special_tokens,
            special_token_ids=(i for i, (_, special) in added.items() if special),
            eos_token_ids=(i for i in eos_ids if 0 <= i < vocab_size),
            chat_templates=templates_from_config(config, f"{name}/{CONFIG_FILE}"),
            unknown_ids=facts.unknown_ids,  # rare; tokenizers would silently drop them
        )
        max_length = config.get("model_max_length")
        # transformers writes a huge sentinel (int(1e30)) when the length is unknown
        known = is_count(max_length) and 0 < max_length < 10**12
        self.model_max_length: int | None = max_length if known else None

    def __getattr__(self, name: str) -> Any:
        # Called only while `_tokenizer` is not set (a deferred build): no cost on any call once it is built.
        if name != "_tokenizer" or self.__dict__.get("_build") is None:
            raise AttributeError(name)
        return self.ensure_built()

    def ensure_built(self, *, for_encoding: bool = False) -> RustTokenizer:
        """The library tokenizer, built now if its build was deferred (`load_configured_tokenizer(eager=True)`
        calls this: the front builds it before it serves, so no request waits for it). `for_encoding` also starts
        building the tiktoken encoder in the background: encodes take the library until it is there."""
        with self._build_lock:
            built = self.__dict__.get("_tokenizer")
            if built is None:
                assert self._build is not None
                start = time.perf_counter()
                built = self._tokenizer = self._build()
                log.info("built the tokenizers tokenizer of %s in %.2f s", self.name, time.perf_counter() - start)
        if for_encoding:
            threading.Thread(target=self.build_tiktoken_encoder, name="tiktoken-encoder", daemon=True).start()
        return built

    def build_tiktoken_encoder(self) -> TiktokenEncoder | None:
        """Build the tiktoken encoder (once): from then on it encodes where it gives the library's ids and offsets
        (`hf_tiktoken`). None where it would not."""
        library = self._tokenizer
        with self._encoder_lock:
            if not self._encoder_tried:
                self._tiktoken_encoder = TiktokenEncoder.build(library)
                self._encoder_tried = True
        return self._tiktoken_encoder

    @staticmethod
    def _read_special_tokens(
        config: Mapping[str, Any], added_in_order: list[str], added: Mapping[int, tuple[str, bool]]
    ) -> SpecialTokens:
        named = {kind: token_text(config.get(f"{kind}_token")) for kind in SPECIAL_TOKEN_ROLES}
        taken = set(named.values())
        additional: dict[str, None] = {}
        for token in config.get("additional_special_tokens") or ():
            content = token_text(token)
            if content is not None and content not in taken:
                additional[content] = None
        special_contents = {content for content, special in added.values() if special}
        for content in added_in_order:
            if content in special_contents and content not in taken:
                additional[content] = None
        return SpecialTokens(**named, additional=tuple(additional))

    @property
    def hf_tokenizer(self) -> RustTokenizer:
        """The underlying `tokenizers.Tokenizer` (read-only use)."""
        return self._tokenizer

    def encode(self, text: str, add_special_tokens: bool = False) -> Encoding:
        fast = self._tiktoken_for(text, add_special_tokens)
        if fast is not None and (encoding := fast.encode(text)) is not None:
            return encoding
        encoding = self._library_encode(text, add_special_tokens)
        return Encoding(ids=encoding.ids, offsets=encoding.offsets)

    def encode_ids(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """encode's ids; through tiktoken also for a text whose NFC form changes its length (its offsets would have
        to be aligned, its ids need not), and without the library's offsets otherwise."""
        fast = self._tiktoken_for(text, add_special_tokens)
        if fast is not None and (ids := fast.encode_ids(text)) is not None:
            return ids
        return self._library_encode(text, add_special_tokens).ids

    def _tiktoken_for(self, text: str, add_special_tokens: bool) -> TiktokenEncoder | None:
        """The tiktoken encoder when it may encode `text` (it adds nothing around the ids), else None."""
        fast = self._tiktoken_encoder
        if fast is not None and isinstance(text, str) and (fast.adds_nothing or not add_special_tokens):
            return fast
        return None

    def _library_encode(self, text: str, add_special_tokens: bool) -> RustEncoding:
        """The library's Encoding of `text`; a long one through encode_batch, which releases the GIL (a long
        prompt must not freeze the front's event loop)."""
        if len(text) > GIL_FREE_ENCODE_CHARS:
            return self._tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)[0]
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = False) -> list[Encoding]:
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=add_special_tokens)
        return [Encoding(ids=e.ids, offsets=e.offsets) for e in encodings]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        if not isinstance(ids, (list, tuple)):
            ids = list(ids)
        self.check_ids(ids)
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def decode_batch(self, sequences: Sequence[Sequence[int]], skip_special_tokens: bool = False) -> list[str]:
        """decode of each sequence, in one call into the Rust library (ids validated in one pass over them all)."""
        self.check_ids(list(chain.from_iterable(sequences)))
        return self._tokenizer.decode_batch(sequences, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        found = self._added_ids.get(token)
        return found if found is not None else self._tokenizer.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        if not 0 <= token_id < self._vocab_size:
            return None
        return self._tokenizer.id_to_token(token_id)

    def added_token_contents(self) -> Mapping[int, str]:
        """id -> content of every added token, special or not (what vLLM's fast detokenizer calls added tokens)."""
        return self._added_contents

    def word_start_marker(self) -> str | None:
        """The replacement character of its Metaspace pre-tokenizer (alone or in a Sequence), else None."""
        return self._word_start_marker

    def token_bytes_table(self) -> TokenBytesTable | None:
        """Per-token bytes for the streaming fast path (None if the decoder is not a byte concatenation)."""
        return hf_token_bytes_table(self._tokenizer, self._vocab_size)

    def content_fingerprint(self) -> str | None:
        """What decode is a function of, for the fast path's disk cache: the tokenizer.json and the library."""
        if self._source_digest is None:
            return None
        return f"tokenizers {tokenizers_version} tokenizer.json sha256 {self._source_digest}"

    def __repr__(self) -> str:
        return f"HFTokenizer(name={self.name!r}, vocab_size={self._vocab_size})"


def read_vocab_facts(tokenizer: RustTokenizer) -> VocabFacts:
    """The vocabulary size, the unknown ids (from the whole vocabulary) and the added tokens."""
    known_ids = set(tokenizer.get_vocab(with_added_tokens=True).values())
    vocab_size = max(known_ids, default=-1) + 1
    unknown = frozenset(range(vocab_size)) - known_ids if len(known_ids) < vocab_size else frozenset()
    added = tokenizer.get_added_tokens_decoder()
    added_tokens = tuple((i, added[i].content, bool(added[i].special)) for i in sorted(added))
    return VocabFacts(vocab_size, unknown, added_tokens, _word_start_marker(tokenizer))


def _word_start_marker(tokenizer: RustTokenizer) -> str | None:
    """The replacement character of a Metaspace pre-tokenizer, alone or in a Sequence (what vLLM reads too)."""
    if tokenizer.pre_tokenizer is None:
        return None
    spec = json.loads(tokenizer.pre_tokenizer.__getstate__())
    parts = spec.get("pretokenizers", []) if spec.get("type") == "Sequence" else [spec]
    for part in parts:
        if isinstance(part, dict) and part.get("type") == "Metaspace":
            return str(part.get("replacement", "\u2581"))
    return None


def find_hf_tokenizer_file(path: Path) -> Path | None:
    """The tokenizer.json(.xz) that `path` names (a file, or a directory holding one), or None."""
    if path.is_dir():
        return next((path / f for f in TOKENIZER_FILES if (path / f).is_file()), None)
    if path.is_file() and path.name.endswith((".json", ".json.xz")):
        return path
    return None


def load_hf_tokenizer(path: Path) -> HFTokenizer:
    """Load a tokenizer.json(.xz) file, or a directory holding one (+ tokenizer_config.json, generation_config.json).
    With the file's vocabulary facts in the load cache, the library tokenizer is built at its first use."""
    file = find_hf_tokenizer_file(path)
    if file is None:
        raise TokenizerLoadError(f"{path}: no {' or '.join(TOKENIZER_FILES)} found")
    raw = _read_source(file)
    source_digest = hashlib.sha256(raw).hexdigest()
    key = load_cache.load_key(source_digest)
    compressed = file.name.endswith(".xz")
    facts = load_cache.read_vocab_facts(key)
    tokenizer = None
    if facts is None or (compressed and load_cache.cached_json_path(key) is None):
        tokenizer, decompressed = _parse(file, raw)
        facts = facts or read_vocab_facts(tokenizer)
        load_cache.write_entry(key, facts, decompressed if compressed else None)
    directory = file.parent
    name = directory.name if file.name in TOKENIZER_FILES else file.name.split(".")[0]
    return HFTokenizer(
        tokenizer,
        name=name,
        config=read_json_file(directory / CONFIG_FILE),
        generation_config=read_json_file(directory / GENERATION_CONFIG_FILE),
        source_digest=source_digest,
        vocab_facts=facts,
        build=lambda: _deferred_build(file, source_digest, key),
    )


def _read_source(file: Path) -> bytes:
    try:
        return file.read_bytes()
    except OSError as exc:
        raise TokenizerLoadError(f"cannot read {file}: {exc}") from exc


def _parse(file: Path, raw: bytes) -> tuple[RustTokenizer, str]:
    """The library tokenizer of a tokenizer.json(.xz) file's bytes, and its JSON text."""
    try:
        text = (lzma.decompress(raw) if file.name.endswith(".xz") else raw).decode("utf-8")
    except (lzma.LZMAError, UnicodeDecodeError) as exc:
        raise TokenizerLoadError(f"cannot read {file}: {exc}") from exc
    return tokenizer_from_json(file, text), text


def tokenizer_from_json(source: str | Path, text: str) -> RustTokenizer:
    """The library tokenizer of tokenizer.json text (TokenizerLoadError naming `source` when it is not one)."""
    try:
        return RustTokenizer.from_str(text)
    except Exception as exc:  # tokenizers raises plain Exception on malformed JSON or unknown components
        raise TokenizerLoadError(f"{source} is not a valid Hugging Face tokenizer.json: {exc}") from exc


def bpe_document(
    vocab: dict[str, int],
    merges: list[list[str]],
    *,
    pre_tokenizer: dict[str, Any],
    decoder: dict[str, Any],
    normalizer: dict[str, Any] | None = None,
    added_tokens: list[dict[str, Any]] | None = None,
    post_processor: dict[str, Any] | None = None,
    **model: Any,
) -> str:
    """The tokenizer.json text of a BPE without byte fallback (`model`: more fields of its model)."""
    document = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added_tokens or [],
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": decoder,
        "model": {"type": "BPE", "vocab": vocab, "merges": merges, "byte_fallback": False, "unk_token": None, **model},
    }
    return json.dumps(document, ensure_ascii=False)


def _deferred_build(file: Path, source_digest: str, key: str) -> RustTokenizer:
    """The library tokenizer of a load that took its facts from the cache: from the cached decompressed JSON, else
    from the source file, which must still be the file those facts describe."""
    path = load_cache.cached_json_path(key)
    if path is not None:
        try:
            return RustTokenizer.from_file(str(path))
        except Exception as exc:  # not what the key says (a damaged file): decompress the source again
            log.warning("ignoring the tokenizer load cache file %s (%s)", path, exc)
    raw = _read_source(file)
    if hashlib.sha256(raw).hexdigest() != source_digest:
        raise TokenizerLoadError(f"{file} changed since it was loaded: restart to load the new file")
    tokenizer, decompressed = _parse(file, raw)
    if file.name.endswith(".xz"):
        load_cache.write_entry(key, read_vocab_facts(tokenizer), decompressed)
    return tokenizer
