"""Fetching only a model's tokenizer files from the Hugging Face Hub (huggingface_hub's snapshot_download).

The environment is read at call time (huggingface_hub reads some of it once, at import): HF_ENDPOINT (another
Hub, e.g. a mirror), HF_TOKEN (sent as a bearer token; gated and private repos need it), HF_HUB_CACHE / HF_HOME
(the cache, shared with transformers), HF_HUB_OFFLINE=1 (never touch the network: use the cache or fail with an
error that says so). huggingface_hub shows progress bars unless HF_HUB_DISABLE_PROGRESS_BARS=1.
"""

from __future__ import annotations

import os
from pathlib import Path

from detok_worker.tokenizer.protocol import TokenizerLoadError

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
