"""From a user's tokenizer spec to a loaded tokenizer: detection (`detect_source`), Hub download
(`download_tokenizer_files`), then the backend (`load_source`), as `create_tokenizer` runs them. Hugging Face
tokenizers (tokenizer.json, and the tokenizer.json documents built here from GGUF metadata or vocab.json +
merges.txt) load through `load_hf`; every backend gets its chat templates from chat_template_source (explicit >
chat_template.jinja > tokenizer_config.json).

`backend` forces a backend instead of detecting one: "hf", "tiktoken", "sentencepiece", "gguf", "tekken" (alias
"mistral"), "python" (a module:Class), "mock", "sglang" or "vllm" (that engine's get_tokenizer). `options` are
passed to the backend: for tiktoken rank files `pattern` and `special_tokens`; for Python classes the constructor
keyword arguments; for sglang/vllm get_tokenizer's keyword arguments.
"""

from __future__ import annotations

import json
import lzma
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from detok_worker.tokenizer.backends.hf import (
    HFTokenizer,
    bpe_document,
    find_hf_tokenizer_file,
    load_hf_tokenizer,
    tokenizer_from_json,
)
from detok_worker.tokenizer.chat.source import DEFAULT_NAME, ChatTemplates, load_chat_template
from detok_worker.tokenizer.loading.detect import SourceKind, TokenizerSource, detect_directory
from detok_worker.tokenizer.loading.side_files import read_side_config
from detok_worker.tokenizer.protocol import Tokenizer, TokenizerLoadError

_KIND_OF_BACKEND = {
    "hf": SourceKind.HF_JSON,
    "tiktoken": SourceKind.TIKTOKEN_FILE,
    "sentencepiece": SourceKind.SENTENCEPIECE,
    "gguf": SourceKind.GGUF,
    "tekken": SourceKind.TEKKEN,
    "mistral": SourceKind.TEKKEN,
}
BACKENDS = (*_KIND_OF_BACKEND, "python", "mock", "sglang", "vllm")


def _with_templates(tokenizer: HFTokenizer, templates: ChatTemplates | None) -> HFTokenizer:
    """Give an HF tokenizer the templates chat_template_source found (explicit file, chat_template.jinja, ...)."""
    if templates is not None:
        tokenizer.use_chat_templates(templates)
    return tokenizer


def _hf_from_document(
    document: str,
    *,
    name: str,
    config_dir: Path | None,
    templates: ChatTemplates | None,
    config: dict[str, Any] | None = None,
) -> HFTokenizer:
    """An HF tokenizer from tokenizer.json text, with the side files of `config_dir` (or an explicit config)."""
    rust = tokenizer_from_json(name, document)
    side = read_side_config(config_dir)
    generation = {"eos_token_id": list(side.generation_eos_ids)} if side.generation_eos_ids else None
    tokenizer = HFTokenizer(rust, name=name, config={**side.raw, **(config or {})}, generation_config=generation)
    return _with_templates(tokenizer, templates)


def load_hf(path: Path, chat_template: str | Path | None = None) -> HFTokenizer:
    """A tokenizer.json file (any name, optionally xz-compressed) or a directory holding one."""
    directory = path if path.is_dir() else path.parent
    if find_hf_tokenizer_file(path) is not None:
        return _with_templates(load_hf_tokenizer(path), load_chat_template(directory, chat_template))
    try:
        raw = path.read_bytes()
        document = (lzma.decompress(raw) if raw.startswith(b"\xfd7zXZ\x00") else raw).decode("utf-8-sig")
    except (OSError, lzma.LZMAError, UnicodeDecodeError) as exc:
        raise TokenizerLoadError(f"cannot read {path}: {exc}") from exc
    templates = load_chat_template(directory, chat_template)
    return _hf_from_document(document, name=path.name, config_dir=directory, templates=templates)


def forced_source(spec: str, backend: str) -> TokenizerSource:
    path = Path(spec).expanduser()
    if backend in ("python", "sglang", "vllm", "mock"):
        return TokenizerSource(SourceKind.PYTHON, name=spec)
    if backend == "tiktoken" and not path.exists():
        return TokenizerSource(SourceKind.TIKTOKEN_NAME, name=spec)
    if not path.exists():
        raise TokenizerLoadError(f"backend {backend!r} needs an existing file or directory, got {spec!r}")
    kind = _KIND_OF_BACKEND[backend]
    if path.is_dir():
        found = detect_directory(path)
        if found.kind is not kind and kind is not SourceKind.HF_JSON:
            raise TokenizerLoadError(f"directory {path} holds a {found.kind.value} tokenizer, not {backend}")
        return found if kind is not SourceKind.HF_JSON else TokenizerSource(kind, path)
    return TokenizerSource(kind, path)


def load_source(
    source: TokenizerSource,
    *,
    chat_template: str | Path | None = None,
    options: Mapping[str, Any] | None = None,
) -> Tokenizer:
    """Load an already-detected source with its backend."""
    options = dict(options or {})
    kind, path = source.kind, source.path
    if kind is SourceKind.PYTHON:
        from detok_worker.tokenizer.backends.python import load_python_class

        return load_python_class(str(source.name), options)
    if kind is SourceKind.TIKTOKEN_NAME:
        from detok_worker.tokenizer.backends.tiktoken import load_named_encoding

        return load_named_encoding(str(source.name), chat_templates=load_chat_template(None, chat_template))
    if path is None:  # a Hub id: load_tokenizer downloads it first
        raise TokenizerLoadError(f"no loader for tokenizer kind {kind.value}")
    if kind is SourceKind.HF_JSON:
        return load_hf(path, chat_template)
    if kind is SourceKind.GGUF:
        return _load_gguf(path, chat_template=chat_template)
    templates = load_chat_template(path if path.is_dir() else path.parent, chat_template)
    if kind is SourceKind.TIKTOKEN_FILE:
        from detok_worker.tokenizer.backends.tiktoken import load_rank_file

        return load_rank_file(path, chat_templates=templates, **options)
    if kind is SourceKind.SENTENCEPIECE:
        from detok_worker.tokenizer.backends.sentencepiece import load_sentencepiece

        return load_sentencepiece(path, chat_templates=templates)
    if kind is SourceKind.TEKKEN:
        from detok_worker.tokenizer.backends.mistral import TekkenTokenizer

        return TekkenTokenizer(path, chat_templates=templates)
    assert kind is SourceKind.VOCAB_MERGES
    return _hf_from_document(vocab_merges_document(path), name=path.name, config_dir=path, templates=templates)


def _load_gguf(path: Path, *, chat_template: str | Path | None) -> Tokenizer:
    from detok_worker.tokenizer.backends.gguf import read_metadata, tokenizer_parts
    from detok_worker.tokenizer.backends.sentencepiece import SentencePieceTokenizer
    from detok_worker.tokenizer.base import import_optional

    parts = tokenizer_parts(read_metadata(path), str(path))
    templates = load_chat_template(None, chat_template)
    if templates is None and parts.chat_template:
        templates = ChatTemplates({DEFAULT_NAME: parts.chat_template}, f"{path} (tokenizer.chat_template)")
    if parts.sentencepiece_proto is not None:
        import_optional("sentencepiece", "gguf")  # the message names the extra a GGUF user installs
        return SentencePieceTokenizer(model_proto=parts.sentencepiece_proto, name=str(path), chat_templates=templates)
    named = {"bos": parts.bos_id, "eos": parts.eos_id, "unk": parts.unk_id, "pad": parts.pad_id}
    config = {f"{role}_token": parts.token_texts[i] for role, i in named.items() if i is not None}
    return _hf_from_document(parts.tokenizer_json, name=path.name, config_dir=None, templates=templates, config=config)


def vocab_merges_document(directory: Path) -> str:
    """A GPT-2 style byte-level BPE tokenizer.json for a vocab.json + merges.txt directory."""
    try:
        vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
        lines = (directory / "merges.txt").read_text(encoding="utf-8").splitlines()
    except (OSError, ValueError) as exc:
        raise TokenizerLoadError(f"cannot read vocab.json/merges.txt in {directory}: {exc}") from exc
    merges = [line.split(" ", 1) for line in lines if line and not line.startswith("#version") and " " in line]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return bpe_document(vocab, merges, pre_tokenizer=byte_level, decoder=byte_level)


# Hub download: only a model's tokenizer files (huggingface_hub's snapshot_download).
# The environment is read at call time (huggingface_hub reads some of it once, at import): HF_ENDPOINT (another
# Hub, e.g. a mirror), HF_TOKEN (sent as a bearer token; gated and private repos need it), HF_HUB_CACHE / HF_HOME
# (the cache, shared with transformers), HF_HUB_OFFLINE=1 (never touch the network: use the cache or fail with an
# error that says so). huggingface_hub shows progress bars unless HF_HUB_DISABLE_PROGRESS_BARS=1.

# Everything a tokenizer can need, and nothing else (no weights).
TOKENIZER_FILE_PATTERNS: tuple[str, ...] = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "generation_config.json",
    "vocab.json",
    "merges.txt",
    "*.model",
    "*.tiktoken",
    "tekken.json",
    "chat_template.jinja",
    "chat_template.json",
    "additional_chat_templates/*.jinja",
)
_TRUE = ("1", "true", "yes", "on")


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def hub_cache_dir() -> Path:
    """Where Hub files are cached: HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def download_tokenizer_files(repo_id: str, revision: str | None = None) -> Path:
    """The local directory holding the tokenizer files of `repo_id` at `revision` (downloaded if needed)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    offline = hub_offline()
    cache = hub_cache_dir()
    where = f"{repo_id!r}" + (f" at revision {revision!r}" if revision else "")
    try:
        directory = snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=cache,
            allow_patterns=list(TOKENIZER_FILE_PATTERNS),
            local_files_only=offline,
            token=os.environ.get("HF_TOKEN") or None,
            endpoint=os.environ.get("HF_ENDPOINT") or None,
        )
    except LocalEntryNotFoundError as exc:
        reason = "offline mode is on (HF_HUB_OFFLINE=1)" if offline else "the Hub could not be reached"
        raise TokenizerLoadError(
            f"tokenizer of {where} is not in the Hugging Face cache ({cache}) and {reason}; "
            "download it once online (same HF_HOME), or pass a local path"
        ) from exc
    except GatedRepoError as exc:
        raise TokenizerLoadError(f"{where} is gated: set HF_TOKEN to a token with access ({exc})") from exc
    except RepositoryNotFoundError as exc:
        raise TokenizerLoadError(
            f"{where} was not found on the Hub (or is private: set HF_TOKEN); it is also not a local path"
        ) from exc
    except RevisionNotFoundError as exc:
        raise TokenizerLoadError(f"revision {revision!r} of {repo_id!r} does not exist") from exc
    except (OSError, ValueError) as exc:  # network and HTTP errors from huggingface_hub
        raise TokenizerLoadError(f"could not download the tokenizer of {where}: {exc}") from exc
    path = Path(directory)
    if not any(path.iterdir()):
        raise TokenizerLoadError(f"{where} has no tokenizer files (looked for {', '.join(TOKENIZER_FILE_PATTERNS)})")
    return path
