"""StopSequenceDecoder with model_vocab_size: an id the tokenizer lacks below it is a token without text, as the
tokenizer's full decode (Hugging Face `tokenizers`, the reference) drops it; any other bad id still raises."""

from __future__ import annotations

import pytest
from helpers.tokenizer_files import reference_hf_tokenizer

from detok_worker.errors import ParameterError
from detok_worker.stream import StopSequenceConfig, StopSequenceDecoder
from detok_worker.stream.stop import Held, Stopped, StoppedWithText
from detok_worker.tokenizer.protocol import InvalidTokenIdError

MODEL_VOCAB = 151_936  # Qwen3's config.json vocab_size; its tokenizer has 151,669 ids


def test_process_token_holds_an_id_without_text_and_raises_past_the_model(qwen3) -> None:
    jellyfish = qwen3.encode("🪼").ids
    decoder = StopSequenceDecoder(qwen3, StopSequenceConfig(), model_vocab_size=MODEL_VOCAB)
    assert decoder.process_token(jellyfish[0]) == Held()
    assert decoder.process_token(MODEL_VOCAB - 1) == Held()  # between the pieces of the character
    assert "".join(decoder.process_token(token_id).text for token_id in jellyfish[1:]) == "🪼"
    assert decoder.num_generated == len(jellyfish) + 1
    with pytest.raises(InvalidTokenIdError, match=f"token id {MODEL_VOCAB} is out of range for the model"):
        decoder.process_token(MODEL_VOCAB)
    with pytest.raises(InvalidTokenIdError, match="token id -1 is out of range"):
        decoder.process_token(-1)
    plain = StopSequenceDecoder(qwen3, StopSequenceConfig())
    with pytest.raises(InvalidTokenIdError, match=f"token id {qwen3.vocab_size} is out of range for this tokenizer"):
        plain.process_token(qwen3.vocab_size)


def test_a_stop_token_after_an_id_without_text_ends_the_text_before_it(qwen3) -> None:
    """The unfinished character before the stop token becomes U+FFFD, as the full decode shows it."""
    jellyfish = qwen3.encode("🪼").ids
    eos = min(qwen3.eos_token_ids)
    config = StopSequenceConfig(visible_stop_tokens=(eos,))
    decoder = StopSequenceDecoder(qwen3, config, model_vocab_size=MODEL_VOCAB)
    ids = [jellyfish[0], qwen3.vocab_size, eos]
    out = decoder.process_tokens(ids)
    reference = reference_hf_tokenizer("qwen3").decode(ids, skip_special_tokens=False)
    assert (out.text, out.stopped, out.stop_reason, out.consumed, out.unknown_ids) == (reference, True, eos, 3, 1)
    assert reference == "\ufffd<|im_end|>"
    stopped = StopSequenceDecoder(qwen3, config, model_vocab_size=MODEL_VOCAB)
    assert stopped.process_token(eos) == StoppedWithText("<|im_end|>", eos)
    assert stopped.process_token(qwen3.vocab_size) == Stopped(eos)  # nothing after a stop


@pytest.mark.parametrize("size", [-1, True, 1.5])
def test_model_vocab_size_must_be_a_count(qwen3, size) -> None:
    with pytest.raises(ParameterError, match="model_vocab_size"):
        StopSequenceDecoder(qwen3, StopSequenceConfig(), model_vocab_size=size)
