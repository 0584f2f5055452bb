"""What `detok serve` and `detok trace record` do before the supervisor starts: the same checks for both."""

from __future__ import annotations

import os
import sys

from detok_worker.config import DetokConfig
from detok_worker.config.flags import VLLM_FLAGS_APPLIED_ENV, vllm_flags_digest
from detok_worker.errors import OperatorError
from detok_worker.process.logs import setup_logging


def with_vllm_flags(config: DetokConfig, *, needs_vllm: bool = True) -> DetokConfig:
    """On source = vllm: the front-end flags among engine.vllm_args applied (or refused), unless the supervisor
    that started this process did so already (its config file holds the result). Without vLLM installed: an
    OperatorError, or (needs_vllm false: `detok config`) the config as it is, with a warning."""
    if config.engine.source != "vllm" or os.environ.get(VLLM_FLAGS_APPLIED_ENV) == vllm_flags_digest(config):
        return config
    try:
        from detok_worker.engine.vllm_flags import apply_vllm_flags  # imports vLLM: only on this source
    except ImportError as exc:
        message = f"--source vllm needs vLLM installed in this environment ({exc}); see README, With a real engine"
        if needs_vllm:
            raise OperatorError(message) from exc
        print(f"detok: warning: {message}; the vllm serve flags are shown as given, not applied", file=sys.stderr)
        return config
    return apply_vllm_flags(config)


def run_service(config: DetokConfig, startup_timeout_s: float) -> int:
    """Run front + engine + workers under the supervisor. On source = vllm the vLLM flags are applied here, once:
    the supervisor tells its children so, and they do not apply them again."""
    from detok_worker.front.api_key import resolve_api_keys
    from detok_worker.process.supervisor import serve

    config = with_vllm_flags(config)
    resolve_api_keys(config.front)  # a conflicting or unsafe key source fails here, before any child starts
    setup_logging("serve", config.logging.level, config.logging.format)
    return serve(config, startup_timeout_s=startup_timeout_s)
