"""A reusable differential harness for streaming detokenization: any backend plugs in, every case is checked.

Plugging a backend in: add a `Family` to families.py: how to load the tokenizer (no network: fixture files or files
installed packages ship) and how to build its `ByteOracle` (oracle.py) from an independent source of per-token
bytes (the token strings of tokenizer.json, SentencePiece's own pieces, tiktoken's or mistral-common's byte pieces),
with the decoder's byte semantics: `lossy` (byte-level: all bytes joined, Rust's from_utf8_lossy), `run` (Hugging
Face ByteFallback: a run of byte tokens is its text if valid UTF-8, else one U+FFFD per byte) or `per_byte`
(SentencePiece: each byte of an ill-formed sequence is one U+FFFD).

Cases (cases.py): canonical texts (tests/fixtures/texts), random ids biased to byte tokens and partial characters,
surrogate and overlong byte prefixes (ED A0.., E0 80, F0 80, F4 90, C0/C1, F5..FF), runs of special tokens of every
length up to 300 after a prompt that ends inside a character, prompts cut at every byte of a character, long runs
of invalid bytes before a character. check.py streams each case and checks, after every step, that the text
emitted so far is exactly what the oracle says can no longer change (no late character, nothing premature), and at
the end that everything equals the tokenizer's own decode.

test_differential.py runs every family in the default suite in bounded time and many more seeds under `slow`.
"""
