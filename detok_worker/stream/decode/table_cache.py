"""The verified fast-path tables on disk, so a process that loads a tokenizer seen before skips the build and the
verification (fast_path.py): one msgpack file per tokenizer content under the user cache directory.

Where: $DETOK_CACHE_DIR if set (empty disables the cache), else $XDG_CACHE_HOME/detok, else ~/.cache/detok; files
go to its `fast-path/` folder. Every file may be deleted at any time (it is rebuilt on the next start).

The key covers everything the verification depended on: the tokenizer's own content fingerprint (the optional
backend hook `content_fingerprint()`, e.g. the sha256 of the tokenizer.json it was loaded from and the library
version that decodes it; a tokenizer without one is never cached), its class, vocabulary size and special ids, the
file format version, and a hash of the detok source code that builds, verifies and decodes the tables (so a code
change, released or not, never reuses an old verdict). A file starts with the sha256 of the rest: a file whose
bytes are not the ones written after the verification (damaged, truncated, edited), or that does not decode, or
has another format or key, is ignored and rebuilt. Reading a file back needs no decode by the tokenizer, so a
process whose tables come from here never has to build the library tokenizer for them (backends/hf.py defers
that build). A cache directory that cannot be written disables caching.

Builds are serialised across processes by an advisory lock per key: N workers starting together verify once, and
the others read what the first one wrote.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import msgspec

from detok_worker.tokenizer.loading.load_cache import CACHE_DIR_ENV as CACHE_DIR_ENV  # where it was defined first
from detok_worker.tokenizer.loading.load_cache import cache_root, content_key
from detok_worker.tokenizer.protocol import Tokenizer
from detok_worker.tokenizer.token_bytes import TokenBytesTable

log = logging.getLogger(__name__)

FORMAT_VERSION = 2
_SUBDIR = "fast-path"
_PACKAGE = Path(__file__).resolve().parents[2]  # detok_worker/
# The code a cached verdict depends on: the tables, streams and verification, and the backends' decode and tables.
_SOURCE_DIRS = (_PACKAGE / "stream" / "decode", _PACKAGE / "tokenizer")


class CachedFastPath(msgspec.Struct, array_like=True, gc=False):
    """One tokenizer's verified (or refused) byte table, as written to disk."""

    format: int
    key: str
    verified: bool
    reason: str  # the verification outcome fast_path.py reports
    pieces: list[bytes | None]  # empty when the table was refused
    byte_tokens: dict[int, int]
    strip_leading_spaces: int
    skipped_special_ends_text: bool

    def table(self) -> TokenBytesTable:
        return TokenBytesTable(
            pieces=self.pieces,
            byte_tokens=self.byte_tokens,
            strip_leading_spaces=self.strip_leading_spaces,
            skipped_special_ends_text=self.skipped_special_ends_text,
        )


_DIGEST_SIZE = 32  # the sha256 of the msgpack entry that follows it in the file
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(CachedFastPath)


def cache_dir() -> Path | None:
    """The directory of the fast-path cache files, or None when caching is disabled."""
    root = cache_root()
    return root / _SUBDIR if root is not None else None


@cache
def source_digest() -> str:
    """sha256 over the detok sources the tables and their verification are computed by (once per process)."""
    digest = hashlib.sha256()
    for directory in _SOURCE_DIRS:
        for path in sorted(directory.rglob("*.py")):
            digest.update(path.relative_to(_PACKAGE).as_posix().encode() + b"\x00")
            digest.update(path.read_bytes())
    return digest.hexdigest()


def cache_key(tokenizer: Tokenizer) -> str | None:
    """The key of this tokenizer's tables, or None when its backend gives no content fingerprint."""
    return content_key(tokenizer, format=FORMAT_VERSION, code=source_digest())


def _path(directory: Path, key: str) -> Path:
    return directory / f"{key}.msgpack"


def read_cached(key: str) -> CachedFastPath | None:
    """The entry stored under `key`, or None (no cache, no file, or a file that is not a valid entry for it)."""
    directory = cache_dir()
    if directory is None:
        return None
    path = _path(directory, key)
    try:
        data = path.read_bytes()
    except OSError:
        return None
    digest, payload = data[:_DIGEST_SIZE], data[_DIGEST_SIZE:]
    if hashlib.sha256(payload).digest() != digest:
        log.warning("ignoring the fast-path cache file %s: its content is not what was written; rebuilding it", path)
        return None
    try:
        entry = _decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        log.warning("ignoring the corrupt fast-path cache file %s (%s); rebuilding it", path, exc)
        return None
    if entry.format != FORMAT_VERSION or entry.key != key:
        log.warning("ignoring the fast-path cache file %s: it was written for another key or format", path)
        return None
    return entry


def write_cached(key: str, table: TokenBytesTable | None, verified: bool, reason: str) -> Path | None:
    """Store the outcome under `key` (atomically: a temporary file renamed over the target). Returns the file, or
    None when there is no usable cache directory (a read-only one just disables caching)."""
    directory = cache_dir()
    if directory is None:
        return None
    entry = CachedFastPath(
        format=FORMAT_VERSION,
        key=key,
        verified=verified,
        reason=reason,
        pieces=list(table.pieces) if table is not None and verified else [],
        byte_tokens=dict(table.byte_tokens) if table is not None and verified else {},
        strip_leading_spaces=table.strip_leading_spaces if table is not None else 0,
        skipped_special_ends_text=table.skipped_special_ends_text if table is not None else False,
    )
    target = _path(directory, key)
    temporary: str | None = None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=directory, prefix=f".{key[:16]}.", suffix=".tmp")
        payload = _encoder.encode(entry)
        with os.fdopen(fd, "wb") as file:
            file.write(hashlib.sha256(payload).digest() + payload)
        os.replace(temporary, target)
    except OSError as exc:
        log.info("fast-path cache disabled: cannot write %s (%s)", target, exc)
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
        return None
    return target


@contextlib.contextmanager
def build_lock(key: str) -> Iterator[None]:
    """Hold an exclusive advisory lock for building `key` (a no-op where the directory or locking is unavailable)."""
    directory = cache_dir()
    try:
        import fcntl
    except ImportError:  # not POSIX: builds may run twice, the rename keeps every file whole
        fcntl = None  # type: ignore[assignment]
    if directory is None or fcntl is None:
        yield
        return
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(directory / f".{key}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock
