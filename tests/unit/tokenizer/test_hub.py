"""Hub downloads against a fake Hugging Face Hub on loopback (HF_ENDPOINT): only tokenizer files are fetched,
they are cached under HF_HOME, HF_HUB_OFFLINE=1 then works from the cache, HF_TOKEN is sent as a bearer token,
and the failures (offline and not cached, unknown repo, gated repo) are clear TokenizerLoadErrors."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers.fixtures import FIXTURE_TOKENIZER_DIRS
from helpers.tokenizer_files import fixture_tokenizer_json

from detok_worker.tokenizer.loading.routing import download_tokenizer_files
from detok_worker.tokenizer.protocol import TokenizerLoadError

COMMIT = "0123456789abcdef0123456789abcdef01234567"
WEIGHTS = "model-00001-of-00002.safetensors"


@dataclass
class FakeHub:
    """Repos: repo id -> {path: bytes}. Records every request as (method, path, authorization header)."""

    repos: dict[str, dict[str, bytes]]
    gated: set[str] = field(default_factory=set)
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    url: str = ""

    def handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _reply(self, status: int, body: bytes, headers: dict[str, str], with_body: bool) -> None:
                self.send_response(status)
                for name, value in {**headers, "Content-Length": str(len(body))}.items():
                    self.send_header(name, value)
                self.end_headers()
                if with_body:
                    self.wfile.write(body)

            def _serve(self, with_body: bool) -> None:
                path = self.path.split("?", 1)[0]
                hub.requests.append((self.command, path, self.headers.get("Authorization")))
                error = {"X-Error-Code": "RepoNotFound"}
                if path.startswith("/api/models/"):
                    repo_id = "/".join(path.removeprefix("/api/models/").split("/")[:2])
                    if repo_id not in hub.repos:
                        return self._reply(404, b'{"error": "Repository not found"}', error, with_body)
                    files = hub.repos[repo_id]
                    if "/tree/" in path:  # the recursive file listing
                        tree = [
                            {"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                            for name, data in sorted(files.items())
                        ]
                        return self._reply(
                            200, json.dumps(tree).encode(), {"Content-Type": "application/json"}, with_body
                        )
                    siblings = [{"rfilename": name} for name in sorted(files)]
                    body = json.dumps({"id": repo_id, "sha": COMMIT, "siblings": siblings}).encode()
                    return self._reply(200, body, {"Content-Type": "application/json"}, with_body)
                parts = path.lstrip("/").split("/")
                repo_id, filename = "/".join(parts[:2]), "/".join(parts[4:])
                if repo_id in hub.gated and self.headers.get("Authorization") != "Bearer hf_fake_token":
                    return self._reply(401, b"gated", {"X-Error-Code": "GatedRepo"}, with_body)
                files = hub.repos.get(repo_id)
                if files is None or len(parts) < 5 or parts[2] != "resolve":
                    return self._reply(404, b"not found", error, with_body)
                if filename not in files:
                    return self._reply(404, b"not found", {"X-Error-Code": "EntryNotFound"}, with_body)
                data = files[filename]
                headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{hashlib.sha256(data).hexdigest()}"'}
                return self._reply(200, data, headers, with_body)

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                self._serve(True)

            def do_HEAD(self) -> None:  # noqa: N802
                self._serve(False)

        return Handler

    def downloaded(self) -> set[str]:
        return {
            path.split("/resolve/", 1)[1].split("/", 1)[1]
            for method, path, _ in self.requests
            if method == "GET" and "/resolve/" in path
        }


def _qwen3_repo() -> dict[str, bytes]:
    directory = FIXTURE_TOKENIZER_DIRS["qwen3"]
    return {
        "tokenizer.json": fixture_tokenizer_json("qwen3").encode(),
        "tokenizer_config.json": (directory / "tokenizer_config.json").read_bytes(),
        "generation_config.json": json.dumps({"eos_token_id": [151645, 151643]}).encode(),
        "config.json": b'{"model_type": "qwen3"}',
        WEIGHTS: b"\x00" * 1024,
        "README.md": b"# not a tokenizer file",
    }


@pytest.fixture
def fake_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    hub = FakeHub(repos={"org/name": _qwen3_repo(), "org/gated": _qwen3_repo()}, gated={"org/gated"})
    server = ThreadingHTTPServer(("127.0.0.1", 0), hub.handler())
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    monkeypatch.setenv("HF_TOKEN", "hf_fake_token")
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()


def test_downloads_only_tokenizer_files_then_works_offline(
    fake_hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = download_tokenizer_files("org/name")
    assert directory.is_relative_to(tmp_path / "hf-home" / "hub")
    assert sorted(p.name for p in directory.iterdir()) == [
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert fake_hub.downloaded() == {"generation_config.json", "tokenizer.json", "tokenizer_config.json"}
    assert (directory / "tokenizer.json").read_text() == fixture_tokenizer_json("qwen3")
    assert {auth for _, path, auth in fake_hub.requests if "org/name" in path} == {"Bearer hf_fake_token"}

    seen = len(fake_hub.requests)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert download_tokenizer_files("org/name") == directory
    assert [r for r in fake_hub.requests[seen:] if "org/name" in r[1]] == []  # served from the cache


def test_offline_and_not_cached_is_a_clear_error(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(TokenizerLoadError, match=r"not in the Hugging Face cache .*HF_HUB_OFFLINE=1"):
        download_tokenizer_files("org/name")
    assert [r for r in fake_hub.requests if "org/name" in r[1]] == []


def test_unknown_and_gated_repos(fake_hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TokenizerLoadError, match="not found on the Hub"):
        download_tokenizer_files("org/missing")
    assert download_tokenizer_files("org/gated").joinpath("tokenizer.json").is_file()
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "fresh-home"))
    with pytest.raises(TokenizerLoadError, match="gated: set HF_TOKEN"):
        download_tokenizer_files("org/gated")


def test_create_tokenizer_from_a_hub_id(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    from detok_worker.tokenizer import create_tokenizer
    from detok_worker.tokenizer.backends.hf import HFTokenizer

    tokenizer = create_tokenizer("org/name", revision="v1.0")
    assert isinstance(tokenizer, HFTokenizer)
    assert (
        tokenizer.encode("hello 你好").ids == create_tokenizer(FIXTURE_TOKENIZER_DIRS["qwen3"]).encode("hello 你好").ids
    )
    assert tokenizer.eos_token_ids == frozenset({151645, 151643})  # generation_config.json came along
    assert ("GET", "/api/models/org/name/revision/v1.0", "Bearer hf_fake_token") in fake_hub.requests
    assert WEIGHTS not in fake_hub.downloaded()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert create_tokenizer("org/name", revision="v1.0").vocab_size == tokenizer.vocab_size
    with pytest.raises(TokenizerLoadError, match="HF_HUB_OFFLINE"):
        create_tokenizer("org/other")
