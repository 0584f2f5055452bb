"""Where the front's API key comes from (detok_worker/front/api_key.py): one source only, a key file only its
owner can read."""

from __future__ import annotations

from pathlib import Path

import pytest

from detok_worker.config import ConfigError, FrontConfig
from detok_worker.front.api_key import API_KEY_ENV, resolve_api_keys


def key_file(tmp_path: Path, text: str, mode: int) -> Path:
    path = tmp_path / "key"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_each_source_alone(tmp_path: Path) -> None:
    assert resolve_api_keys(FrontConfig(), {}) == ()
    assert resolve_api_keys(FrontConfig(api_key="in-config"), {}) == ("in-config",)
    assert resolve_api_keys(FrontConfig(), {API_KEY_ENV: "in-env"}) == ("in-env",)
    assert resolve_api_keys(FrontConfig(api_keys=["k1", "k2"]), {}) == ("k1", "k2")
    path = key_file(tmp_path, "  in-file\n", 0o600)
    assert resolve_api_keys(FrontConfig(api_key_file=str(path)), {}) == ("in-file",)
    assert resolve_api_keys(FrontConfig(api_key_file=str(path)), {API_KEY_ENV: ""}) == ("in-file",)  # empty = unset


@pytest.mark.parametrize(
    ("config", "environ", "message"),
    [
        (FrontConfig(api_key="a"), {API_KEY_ENV: "b"}, "more than one place (front.api_key, DETOK_API_KEY)"),
        (FrontConfig(api_key_file="/nonexistent/key"), {API_KEY_ENV: "b"}, "DETOK_API_KEY, front.api_key_file"),
        (FrontConfig(api_key_file="/nonexistent/key"), {}, "cannot read front.api_key_file /nonexistent/key"),
        (FrontConfig(api_keys=["b"]), {API_KEY_ENV: "a"}, "DETOK_API_KEY, front.api_keys"),
    ],
)
def test_conflicts_and_missing_files_are_refused(config: FrontConfig, environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match="^.*" + message.replace("(", r"\(").replace(")", r"\)")):
        resolve_api_keys(config, environ)


def test_unsafe_or_empty_key_files_are_refused(tmp_path: Path) -> None:
    readable = key_file(tmp_path, "k", 0o640)
    with pytest.raises(ConfigError, match=r"readable by others \(mode 0o640\); chmod 600"):
        resolve_api_keys(FrontConfig(api_key_file=str(readable)), {})
    empty = key_file(tmp_path, "\n", 0o600)
    with pytest.raises(ConfigError, match="is empty"):
        resolve_api_keys(FrontConfig(api_key_file=str(empty)), {})
    with pytest.raises(ConfigError, match="is not a regular file"):
        resolve_api_keys(FrontConfig(api_key_file=str(tmp_path)), {})
