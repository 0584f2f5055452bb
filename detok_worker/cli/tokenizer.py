"""`detok tokenize`, `detok detokenize` and `detok template`: look inside a tokenizer while debugging.

  detok tokenize "Hello 🫨"                        ids (add --tokens for a token/offset table, --json for JSON)
  echo 15339 1917 | detok detokenize --tokenizer gpt-4  text of ids (args or stdin; spaces, commas or a JSON list)
  detok template messages.json --add-generation-prompt --tokenize

The tokenizer is --tokenizer / the config's tokenizer.path (any spec create_tokenizer accepts: a path, a Hub id,
an OpenAI model or encoding name, module:Class), else the embedded default. Wired into `detok` by
`add_tokenizer_commands(subparsers)`; handlers take (args, config) like the other commands.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any, TextIO

from detok_worker.config import DetokConfig
from detok_worker.config.flags import add_command, add_config_flags
from detok_worker.tokenizer.protocol import Tokenizer, TokenizerError, is_int_id


class ToolInputError(TokenizerError, ValueError):
    """Bad input to a tokenizer debugging command (unreadable ids or messages)."""


def _tokenizer_for(args: argparse.Namespace, config: DetokConfig) -> Tokenizer:
    from detok_worker.tokenizer import create_tokenizer, load_default_tokenizer

    spec = config.tokenizer.path  # --tokenizer (from add_config_flags) sets it
    template = getattr(args, "chat_template", None) or config.tokenizer.chat_template or None
    if not spec and not args.backend:
        tokenizer = load_default_tokenizer()
        if template:
            tokenizer.set_chat_template(template)
        return tokenizer
    return create_tokenizer(spec, backend=args.backend, chat_template=template, revision=args.revision)


def parse_ids(text: str) -> list[int]:
    """Ids from "1 2 3", "1,2,3" or "[1, 2, 3]"."""
    stripped = text.strip()
    try:
        if stripped.startswith("["):
            values = json.loads(stripped)
            if not all(is_int_id(v) for v in values):
                raise ValueError("the JSON list must hold integers")
            return values
        return [int(part) for part in re.split(r"[\s,]+", stripped) if part]
    except ValueError as exc:
        raise ToolInputError(f"cannot read token ids from {stripped[:60]!r}: {exc}") from exc


def cmd_tokenize(args: argparse.Namespace, config: DetokConfig, out: TextIO = sys.stdout) -> int:
    tokenizer = _tokenizer_for(args, config)
    text = sys.stdin.read() if args.text in (None, "-") else args.text
    encoding = tokenizer.encode(text, add_special_tokens=args.add_special_tokens)
    tokens = [tokenizer.id_to_token(i) for i in encoding.ids]
    if args.json:
        record = {"ids": encoding.ids, "tokens": tokens, "offsets": encoding.offsets, "hash": encoding.hash()}
        out.write(json.dumps(record, ensure_ascii=False) + "\n")
    elif args.tokens:
        for token_id, token, (start, end) in zip(encoding.ids, tokens, encoding.offsets, strict=False):
            out.write(f"{token_id}\t{token!r}\t{start}:{end}\t{text[start:end]!r}\n")
        out.write(f"{len(encoding.ids)} tokens, hash {encoding.hash()}\n")
    else:
        out.write(" ".join(map(str, encoding.ids)) + "\n")
    return 0


def cmd_detokenize(args: argparse.Namespace, config: DetokConfig, out: TextIO = sys.stdout) -> int:
    tokenizer = _tokenizer_for(args, config)
    ids = parse_ids(" ".join(args.ids) if args.ids else sys.stdin.read())
    text = tokenizer.decode(ids, skip_special_tokens=args.skip_special_tokens)
    if args.json:
        pieces = [tokenizer.id_to_token(i) for i in ids]
        out.write(json.dumps({"text": text, "tokens": pieces}, ensure_ascii=False) + "\n")
    else:
        out.write(text + ("" if text.endswith("\n") else "\n"))
    return 0


def _load_json(value: str | None, what: str) -> Any:
    if value is None:
        return None
    try:
        with open(value, encoding="utf-8") if value != "-" else sys.stdin as handle:
            return json.load(handle)
    except (OSError, ValueError) as exc:
        raise ToolInputError(f"cannot read {what} from {value}: {exc}") from exc


def cmd_template(args: argparse.Namespace, config: DetokConfig, out: TextIO = sys.stdout) -> int:
    tokenizer = _tokenizer_for(args, config)
    messages = _load_json(args.messages, "messages")
    if isinstance(messages, dict):
        messages = messages.get("messages")  # an OpenAI request body works too
    if not isinstance(messages, list):
        raise ToolInputError("messages must be a JSON list of {role, content} objects (or a request with 'messages')")
    extra = json.loads(args.kwargs) if args.kwargs else {}
    if not isinstance(extra, dict):
        raise ToolInputError("--kwargs must be a JSON object")
    prompt = tokenizer.apply_chat_template(
        messages,
        tools=_load_json(args.tools, "tools"),
        add_generation_prompt=args.add_generation_prompt,
        continue_final_message=args.continue_final_message,
        **extra,
    )
    out.write(prompt + ("" if prompt.endswith("\n") else "\n"))
    if args.tokenize:
        out.write(" ".join(map(str, tokenizer.encode(prompt).ids)) + "\n")
    return 0


def _add_tokenizer_flags(parser: argparse.ArgumentParser) -> None:
    add_config_flags(parser)
    parser.add_argument("--backend", default=None, help="force a backend (hf, tiktoken, sentencepiece, gguf, ...)")
    parser.add_argument("--revision", default=None, help="Hub revision (branch, tag or commit)")


def add_tokenizer_commands(commands: argparse._SubParsersAction) -> None:
    """Register tokenize / detokenize / template on the `detok` sub-command parser."""
    tokenize = add_command(commands, "tokenize", cmd_tokenize, "text -> token ids", _add_tokenizer_flags)
    tokenize.add_argument("text", nargs="?", help="the text (default or '-': stdin)")
    tokenize.add_argument("--add-special-tokens", action="store_true", help="add BOS/EOS as the tokenizer does")
    tokenize.add_argument("--tokens", action="store_true", help="one line per token: id, token, span, text")
    tokenize.add_argument("--json", action="store_true", help="ids, tokens, offsets and hash as JSON")

    detokenize = add_command(commands, "detokenize", cmd_detokenize, "token ids -> text", _add_tokenizer_flags)
    detokenize.add_argument("ids", nargs="*", help="token ids (default: read from stdin)")
    detokenize.add_argument("--skip-special-tokens", action="store_true")
    detokenize.add_argument("--json", action="store_true", help="text and token strings as JSON")

    template = add_command(
        commands, "template", cmd_template, "render a chat template for a conversation", _add_tokenizer_flags
    )
    template.add_argument("messages", nargs="?", default="-", help="JSON file of messages (default: stdin)")
    template.add_argument("--chat-template", default=None, help="a .jinja/.json template instead of the tokenizer's")
    template.add_argument("--tools", default=None, metavar="FILE", help="JSON file with a list of tools")
    template.add_argument("--add-generation-prompt", action="store_true")
    template.add_argument("--continue-final-message", action="store_true")
    template.add_argument(
        "--kwargs", default=None, help='extra template variables as JSON, e.g. {"enable_thinking": false}'
    )
    template.add_argument("--tokenize", action="store_true", help="also print the prompt's token ids")
