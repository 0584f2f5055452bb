"""Configuration: TOML files (configs/, shipped as package data) parsed into frozen msgspec structs, plus the
command-line flags and `--set KEY=VALUE` overrides every subcommand shares (flags.py)."""

from detok_worker.config.schema import (
    BusConfig,
    ConfigError,
    DetokConfig,
    FrontConfig,
    TokenizerCacheConfig,
    WorkerConfig,
    config_to_toml,
    load_config,
    validate,
)

__all__ = [
    "BusConfig",
    "ConfigError",
    "DetokConfig",
    "FrontConfig",
    "TokenizerCacheConfig",
    "WorkerConfig",
    "config_to_toml",
    "load_config",
    "validate",
]
