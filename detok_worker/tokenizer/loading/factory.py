"""create_tokenizer(name_or_path): detect what the spec names and load it with the right backend.

Detection is `detect_source` (by content, directory layout, OpenAI model names, module:Class, Hub ids), loading
`routing.load_source`; Hugging Face tokenizer.json files load through `load_hf_tokenizer`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from detok_worker.tokenizer.protocol import BuildsLazily, Tokenizer, TokenizerLoadError

if TYPE_CHECKING:
    from detok_worker.config import DetokConfig

DEFAULT_TOKENIZER_DIR = Path(__file__).resolve().parents[1] / "data" / "qwen3"


def create_tokenizer(
    name_or_path: str | os.PathLike[str],
    *,
    backend: str | None = None,
    chat_template: str | os.PathLike[str] | None = None,
    revision: str | None = None,
    model_encodings: Mapping[str, str] | None = None,
    **options: Any,
) -> Tokenizer:
    """Load a tokenizer: a file or directory, a Hub model id (at `revision`), an OpenAI model or tiktoken encoding
    name (`model_encodings` extends the model-name table), or module:Class. `backend` skips detection;
    `chat_template` (a .jinja/.json path or a template) replaces the tokenizer's own; `options` go to the backend.
    Raises TokenizerLoadError saying what was tried and what is supported."""
    from detok_worker.tokenizer.loading import routing
    from detok_worker.tokenizer.loading.detect import SourceKind, detect_directory, detect_source

    spec = str(name_or_path)
    if backend is not None and backend not in routing.BACKENDS:
        raise TokenizerLoadError(f"unknown tokenizer backend {backend!r}; known: {', '.join(routing.BACKENDS)}")
    if backend in ("sglang", "vllm"):
        from detok_worker.tokenizer.backends.python import load_engine_tokenizer

        return load_engine_tokenizer(backend, spec, **options)
    if backend == "mock":
        from detok_worker.tokenizer.backends.mock import MockTokenizer

        return MockTokenizer(**options)
    source = routing.forced_source(spec, backend) if backend else detect_source(spec, model_encodings)
    if source.kind is SourceKind.HUB:
        source = detect_directory(routing.download_tokenizer_files(spec, revision))
    return routing.load_source(source, chat_template=chat_template, options=options)


def load_default_tokenizer() -> Tokenizer:
    """The tokenizer embedded in the package (Qwen3), usable without any download."""
    return create_tokenizer(DEFAULT_TOKENIZER_DIR)


def load_configured_tokenizer(config: DetokConfig, *, eager: bool = False) -> Tokenizer:
    """The tokenizer a detok config names ([tokenizer] path, backend, revision, model_encodings, chat_template);
    the embedded default when no path is set. Every process loads its tokenizer through here. A backend may defer
    its costliest part to the first use that needs it (HFTokenizer with its facts in the load cache: building the
    library tokenizer); `eager` does it now, for a process whose first request must not wait for it."""
    settings = config.tokenizer
    tokenizer = create_tokenizer(
        settings.path or DEFAULT_TOKENIZER_DIR,
        backend=settings.backend or None,
        chat_template=settings.chat_template or None,
        revision=settings.revision or None,
        model_encodings=settings.model_encodings or None,
    )
    if eager and isinstance(tokenizer, BuildsLazily):
        tokenizer.ensure_built(for_encoding=True)
    return tokenizer
