"""The generic streaming algorithm: a prefix/read window diff, for any tokenizer (only decode is needed).

Like TGI/vLLM/the SGLang router it decodes a small window of ids, starting 5 ids back into the prompt, and emits
what the newest ids added. It fixes their known faults:
- Text is emitted per character, not per window: a token that completes "abc" and starts a multi-byte character
  emits "abc" at once; only the part that can still change is withheld.
- What can still change: any tail that appending a lone "probe" byte token would rewrite (byte-fallback decoders
  turn a whole run of byte tokens into U+FFFD when the run becomes invalid, so text that decoded fine can still
  change), and an unfinished character. The probe is the first non-special id whose own decode is exactly U+FFFD,
  found once per tokenizer; a tokenizer without one has no byte semantics. When the tokenizer has raw-byte tokens
  (`<0xNN>`, byte_tokens.py) the stream knows which trailing ids are an unfinished character (utf8.py) and also
  compares with the text after a continuation that completes it; everything else is final, so a long run of
  invalid bytes is released byte by byte. Without them, a trailing run of U+FFFD is withheld: an incomplete UTF-8
  sequence looks exactly like invalid bytes that stay U+FFFD, and text alone cannot tell them apart.
- The window moves on every step whose text is entirely final, including steps that add no text (ids that decode
  to nothing), so work per step stays bounded; skipped special ids never enter the window at all.
- A withheld tail is bounded too: after MAX_HELD_TOKENS ids without a final point (a long run of invalid bytes
  without raw-byte tokens known), everything but its last character is released and the window restarts from the
  last ids. For byte-level decoders this is exact (only the last U+FFFD of a run can still change); for
  Hugging Face byte-fallback decoders it would only differ after more than MAX_HELD_TOKENS consecutive byte tokens,
  and those tokenizers use the fast path anyway.
- Prompt: the expected text is decode(prompt + generated)[len(decode(prompt)):]. The window starts 5 ids back
  (more, doubling up to MAX_PROMPT_CONTEXT_TOKENS, while its text starts with U+FFFD, i.e. inside a character) from
  the prompt's last ids that are not skipped special tokens, however many of those follow; emitted text is counted
  from the end of the prompt's text, so a character completed across the boundary is the prompt's. With raw-byte
  tokens known, an unfinished character at the end of the prompt that the output completes counts as the one
  character it becomes (decode(prompt) showed it as one U+FFFD per byte). Known limit: with a Hugging Face
  byte-fallback decoder, a prompt ending inside a run of byte tokens that the output continues makes the formula
  itself wrong (decode(prompt) resolved the run too early); the fast path attributes such characters by their bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from detok_worker.stream.decode.base import DecodeStream
from detok_worker.stream.decode.byte_tokens import byte_tokens_for
from detok_worker.stream.decode.registry import cached
from detok_worker.stream.decode.utf8 import completion, is_well_formed, unfinished_length
from detok_worker.tokenizer.protocol import DecodesBatch, InvalidTokenIdError, Tokenizer, id_check

PROMPT_CONTEXT_TOKENS = 5
MAX_PROMPT_CONTEXT_TOKENS = 64
MAX_HELD_TOKENS = 128
REPLACEMENT = "\ufffd"

BatchDecode = Callable[[list[list[int]]], list[str]]


def batch_decoder(tokenizer: Tokenizer, skip_special_tokens: bool, *, large: bool = True) -> BatchDecode:
    """decode for several id lists in one call, with this skip_special_tokens setting: the backend's decode_batch
    when it has one (one call into Rust).

    large=False is for a handful of short lists per call (the generic stream's windows): a parallel decode_batch
    costs more to dispatch than a few plain decode calls."""
    if large and isinstance(tokenizer, DecodesBatch):
        decode_batch = tokenizer.decode_batch
        return lambda sequences: decode_batch(sequences, skip_special_tokens)
    decode = tokenizer.decode
    return lambda sequences: [decode(ids, skip_special_tokens) for ids in sequences]


def _find_probe(tokenizer: Tokenizer) -> int | None:
    decode = batch_decoder(tokenizer, False)
    special = tokenizer.special_token_ids
    chunk = 8192
    for first in range(0, tokenizer.vocab_size, chunk):
        ids = [i for i in range(first, min(first + chunk, tokenizer.vocab_size)) if i not in special]
        try:
            texts = decode([[i] for i in ids])
        except InvalidTokenIdError:  # an id that names no token inside the range: decode one by one
            texts = []
            for i in ids:
                try:
                    texts.append(decode([[i]])[0])
                except InvalidTokenIdError:
                    texts.append("")
        for token_id, text in zip(ids, texts, strict=True):
            if text == REPLACEMENT:
                return token_id
    return None


def probe_token_for(tokenizer: Tokenizer) -> int | None:
    """The generic algorithm's probe id for this tokenizer (see the module docstring); found once."""
    return cached(tokenizer, "generic_probe", lambda: _find_probe(tokenizer))


def common_prefix_length(a: str, b: str) -> int:
    """How many leading characters a and b share."""
    if b.startswith(a):
        return len(a)
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class GenericDecodeStream(DecodeStream):
    """Window-diff DecodeStream; works with any tokenizer (see the module docstring)."""

    __slots__ = (
        "_skipped",
        "_check",
        "_decode",
        "_probe",
        "_bytes",
        "_owned_tail",
        "_ids",
        "_read",
        "_prefix_text",
        "_sent",
        "_read_is_final",
    )
    fast_path = False

    @classmethod
    def open(cls, tokenizer: Tokenizer, prompt_ids: Sequence[int], skip_special_tokens: bool) -> GenericDecodeStream:
        stream = object.__new__(cls)
        stream._setup(tokenizer, prompt_ids, skip_special_tokens)
        return stream

    def _setup(self, tokenizer: Tokenizer, prompt_ids: Sequence[int], skip_special_tokens: bool) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        # Skipped ids are left out of the window, unless the tokenizer's skipped special tokens still end the text
        # before them (Tekken, mistral-common's IGNORE policy): then they go in and decode drops them itself.
        leave_out = skip_special_tokens and not getattr(tokenizer, "skipped_special_ends_text", False)
        self._skipped = frozenset(tokenizer.special_token_ids) if leave_out else frozenset()
        self._check = cached(tokenizer, "id_check", lambda: id_check(tokenizer))
        self._decode = batch_decoder(tokenizer, skip_special_tokens, large=False)
        self._probe = probe_token_for(tokenizer)
        self._bytes = byte_tokens_for(tokenizer)
        # Bytes of an unfinished character the prompt (or a flush) showed as U+FFFD, until the output resolves it.
        self._owned_tail = b""
        self._ids: list[int] = []  # the window: context ids [0, read), then ids whose text is (partly) withheld
        self._read = 0
        self._prefix_text = ""  # decode(ids[:read])
        self._sent = 0  # characters of the window's text past len(prefix_text) already emitted (may be < 0)
        self._read_is_final = True  # whether decode(ids[:read]) can no longer change: the window may start there
        self._start_from_prompt(prompt_ids)

    def _start_from_prompt(self, prompt_ids: Sequence[int]) -> None:
        tail: list[int] = []  # the prompt's last ids that are not skipped, however many skipped ones follow them
        for position in range(len(prompt_ids) - 1, -1, -1):
            if len(tail) == MAX_PROMPT_CONTEXT_TOKENS:
                break
            token_id = prompt_ids[position]
            self._check((token_id,))
            if token_id not in self._skipped:
                tail.append(token_id)
        tail.reverse()
        size = PROMPT_CONTEXT_TOKENS
        window = tail[-size:]
        text = self._decode([window])[0] if window else ""
        while text.startswith(REPLACEMENT) and size < min(len(tail), MAX_PROMPT_CONTEXT_TOKENS):
            size = min(2 * size, MAX_PROMPT_CONTEXT_TOKENS)
            window = tail[-size:]
            text = self._decode([window])[0]
        self._ids, self._read, self._prefix_text, self._sent = window, len(window), text, 0
        self._read_is_final = not window or self._final_length(window, text) == len(text)
        self._owned_tail = self._bytes.unfinished(window) if self._bytes is not None else b""

    # ---- DecodeStream -----------------------------------------------------------------------------------------

    @property
    def tokens(self) -> tuple[int, ...]:
        return tuple(self._ids)

    def step(self, token_id: int) -> str | None:
        return self.step_batch((token_id,))[0] or None

    def step_batch(self, ids: Sequence[int]) -> list[str]:
        self._check(ids)
        skipped = self._skipped
        return ["" if token_id in skipped else self._push(token_id) for token_id in ids]

    def pending_text(self) -> str:
        if not self._ids:
            return ""
        return self._decode([self._ids])[0][len(self._prefix_text) + self._sent :]

    def flush(self) -> str | None:
        if not self._ids:
            return None
        text = self._decode([self._ids])[0]
        start = len(self._prefix_text) + self._sent
        # Everything so far becomes context, as if it had been the prompt.
        self._read, self._prefix_text, self._sent = len(self._ids), text, 0
        self._read_is_final = False
        self._owned_tail = self._bytes.unfinished(self._ids) if self._bytes is not None else b""
        return text[start:] or None

    # ---- the algorithm ----------------------------------------------------------------------------------------

    def _final_length(self, ids: list[int], text: str, probed: str | None = None) -> int:
        """Length of the part of text = decode(ids) that no further id can change (see the module docstring)."""
        if self._probe is None:
            end = len(text)
        else:
            if probed is None:
                probed = self._decode([[*ids, self._probe]])[0]
            end = common_prefix_length(text, probed)
        if self._bytes is not None:
            unfinished = self._bytes.unfinished(ids)
            if unfinished:
                completed = self._decode([[*ids, *self._bytes.ids(completion(unfinished))]])[0]
                end = min(end, common_prefix_length(text, completed))
            return end
        while end > 0 and text[end - 1] == REPLACEMENT:
            end -= 1
        return end

    def _resolve_owned_tail(self, token_id: int) -> None:
        """While the prompt's unfinished character is open: once the output completes it, the prompt owns the one
        character it becomes, not the U+FFFD per byte its text showed (the emitted count moves back by the
        difference); once the output makes it invalid, that text stays as it was."""
        assert self._bytes is not None
        value = self._bytes.value_of.get(token_id)
        data = self._owned_tail + bytes([value]) if value is not None else b""
        if data and unfinished_length(data) == len(data):
            self._owned_tail = data
            return
        if data and is_well_formed(data):
            read = self._read
            in_prompt = len(self._owned_tail) - (len(self._ids) - read)  # every id after read extended the tail
            shown = self._prefix_text
            before = self._decode([self._ids[: read - in_prompt]])[0] if read > in_prompt else ""
            self._sent -= len(shown) - len(before) - 1
        self._owned_tail = b""

    def _push(self, token_id: int) -> str:
        if self._owned_tail:
            self._resolve_owned_tail(token_id)
        ids = self._ids
        ids.append(token_id)
        read = self._read
        if self._probe is None:
            text, window_text = self._decode([ids, ids[read:]])
            end = self._final_length(ids, text, text)
        else:
            text, probed, window_text = self._decode([ids, [*ids, self._probe], ids[read:]])
            end = self._final_length(ids, text, probed)
        start = len(self._prefix_text) + self._sent
        delta = text[start:end] if end > start else ""
        if end == len(text):  # all of the text is final: move the window
            # Characters the prompt's text still owes (it decoded longer than it now does) stay owed.
            owed = max(0, start - len(text))
            if self._read_is_final:
                del ids[:read]
                self._read, self._prefix_text, self._sent = len(ids), window_text, owed
            else:
                # The old read point (e.g. a prompt ending inside a byte run) is no place to start a window.
                self._read, self._prefix_text, self._sent = len(ids), text, owed
                self._read_is_final = True
        else:
            self._sent += len(delta)
            if len(ids) - read > MAX_HELD_TOKENS:
                delta += self._restart_window(text, start + len(delta))
        return delta

    def _restart_window(self, text: str, emitted_end: int) -> str:
        """Bound a tail withheld for too long: release all of it but its last character, restart the window."""
        held = text[emitted_end:]
        released = held[:-1]
        window = self._ids[-PROMPT_CONTEXT_TOKENS:]
        window_text = self._decode([window])[0]
        self._ids, self._read, self._prefix_text = window, len(window), window_text
        self._read_is_final = False
        if held and window_text.endswith(held[-1]):
            self._sent = -1  # the window's last character is the one still withheld
        else:
            released, self._sent = held, 0
        return released
