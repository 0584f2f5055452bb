"""Where the front's API key comes from: `front.api_key` in a config file, the DETOK_API_KEY environment variable,
`front.api_key_file` (a file only its owner can read), or `front.api_keys` (several keys: what vLLM's `--api-key`
and VLLM_API_KEY give on `--source vllm`). At most one of them; never needed on the command line
(`--set front.api_key=...` works but warns: any local user can read a process's arguments in /proc/PID/cmdline)."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from detok_worker.config import ConfigError, FrontConfig

API_KEY_ENV = "DETOK_API_KEY"


def resolve_api_keys(front: FrontConfig, environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The accepted API keys (none = no authentication); ConfigError when sources conflict or the key file is
    unsafe."""
    environ = os.environ if environ is None else environ
    from_env = environ.get(API_KEY_ENV, "")
    given = [name for name, value in (("front.api_key", front.api_key), (API_KEY_ENV, from_env)) if value]
    if front.api_key_file:
        given.append("front.api_key_file")
    if front.api_keys:
        given.append("front.api_keys (vLLM's --api-key or VLLM_API_KEY)")
    if len(given) > 1:
        raise ConfigError(f"the API key is set in more than one place ({', '.join(given)}); keep one")
    if front.api_keys:
        return tuple(front.api_keys)
    if front.api_key_file:
        return (_read_key_file(Path(front.api_key_file)),)
    key = front.api_key or from_env
    return (key,) if key else ()


def _read_key_file(path: Path) -> str:
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"front.api_key_file {path} is not a regular file")
        if info.st_mode & 0o077:
            mode = oct(stat.S_IMODE(info.st_mode))
            raise ConfigError(f"front.api_key_file {path} is readable by others (mode {mode}); chmod 600 it")
        key = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"cannot read front.api_key_file {path}: {exc.strerror}") from exc
    if not key:
        raise ConfigError(f"front.api_key_file {path} is empty")
    return key
