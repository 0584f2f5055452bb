"""Every message that crosses the bus. msgspec Structs, msgpack-encoded, tagged so one decoder per socket
can tell them apart. Per-step messages (TokenBatch, TextBatch and their row structs) are array_like with gc=False:
they are created by the thousand per second and hold no reference cycles.

Directions (see docs/protocol.md):
  front  -> engine : FrontHello, Submit, Abort, Delivered, AdapterCall
  engine -> worker : TokenBatch (opens + rows), Shutdown
  worker -> engine : Hello, Heartbeat, Finish, Goodbye
  worker -> front  : TextBatch, WorkerStats
  engine -> front  : Reject, PromptLogprobs, PromptCached, EngineStats, AdapterAnswer
"""

from __future__ import annotations

import msgspec

# Finish reasons, as OpenAI's finish_reason plus our own "abort" and "error".
FINISH_STOP = "stop"
FINISH_LENGTH = "length"
FINISH_ABORT = "abort"
FINISH_ERROR = "error"
FINISH_REASONS = (FINISH_STOP, FINISH_LENGTH, FINISH_ABORT, FINISH_ERROR)


class DetokParams(msgspec.Struct, array_like=True, gc=False, frozen=True):
    """What a worker needs to turn one request's ids into text.

    stop: stop strings; hidden unless include_stop_str_in_output.
    stop_token_ids: stop token ids (the engine adds the tokenizer's EOS ids unless ignore_eos); their text is
        hidden unless include_stop_str_in_output.
    min_tokens: stop rules are not applied before this many generated tokens.
    reasoning_parser / tool_call_parser: names of the parsers (detok_worker/parse/registry.py) that split the
        output into reasoning, content and tool calls ("" = none). With a parser, stop strings apply to the
        content only.
    return_token_ids: the worker puts the ids of the tokens each delta consumed on it (TextDelta.token_ids), for
        the client's `return_token_ids`; such a rid's deltas carry extras (a request without it pays nothing).
    spaces_between_special_tokens: False (with skip_special_tokens False): vLLM's rule, an added token right after
        an added token gives its content (stream/decode/added_tokens.py).
    tool_function: the function a chat tool_choice names (tool_call_parser "tool_choice_function"): the output is
        its arguments.
    tool_parameter_types: for a tool-call parser that reads the request's tools (the XML-parameter families), its
        function tools as compact JSON, {function: {parameter: [JSON types]}} for the parameters that are not
        strings (parse/tool_types.py); "" = no tools.
    """

    stop: list[str] = []
    stop_token_ids: list[int] = []
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    min_tokens: int = 0
    reasoning_parser: str = ""
    tool_call_parser: str = ""
    return_token_ids: bool = False
    spaces_between_special_tokens: bool = True
    tool_function: str = ""
    tool_parameter_types: str = ""


# Constraint kinds (vLLM's StructuredOutputsParams; the token-only gRPC API's `constraint` oneof).
CONSTRAINT_JSON_SCHEMA = "json_schema"  # spec: the JSON schema, as JSON text
CONSTRAINT_JSON_OBJECT = "json_object"  # any JSON object; spec ""
CONSTRAINT_REGEX = "regex"
CONSTRAINT_GRAMMAR = "grammar"  # an EBNF / GBNF / Lark grammar, as the engine's backend reads it
CONSTRAINT_CHOICE = "choice"  # spec ""; choices: the allowed outputs
CONSTRAINT_STRUCTURAL_TAG = "structural_tag"  # spec: the structural tag, as JSON text
# spec: a chat request's {"tools", "tool_choice", "parallel_tool_calls"} as JSON text; the engine builds the tool-call
# parser's grammar from it (the vLLM source, front.tool_choice_grammar = "tool_parser"), or none where it has none
CONSTRAINT_TOOL_CALLS = "tool_calls"
CONSTRAINT_KINDS = (
    CONSTRAINT_JSON_SCHEMA,
    CONSTRAINT_JSON_OBJECT,
    CONSTRAINT_REGEX,
    CONSTRAINT_GRAMMAR,
    CONSTRAINT_CHOICE,
    CONSTRAINT_STRUCTURAL_TAG,
    CONSTRAINT_TOOL_CALLS,
)


class Constraint(msgspec.Struct, array_like=True, gc=False, frozen=True):
    """What the engine must constrain the output to (structured outputs): one kind, its spec."""

    kind: str
    spec: str = ""
    choices: list[str] = []


# SamplingParams.logprobs at most: vLLM's default max_logprobs (OpenAI: 20 for chat, 5 for completions)
MAX_TOP_LOGPROBS = 20


class SamplingParams(msgspec.Struct, array_like=True, gc=False, frozen=True):
    """How the engine samples: the client's values, None where the client left the engine's default.
    Validated by the front (ranges as in vLLM); detok itself never samples, it only forwards them.

    top_k: -1 = off. logit_bias: token id -> bias (-100..100). n: completions per prompt. logprobs: top
    log-probabilities to return per output token (None: none; 0: the sampled token's only).
    constraint: structured output (response_format, guided_*, structured_outputs, a required tool call).
    allowed_token_ids: the only ids the engine may sample (None: any). bad_words: words the engine must never
    generate (vLLM tokenizes each with and without a leading space and bans those sequences).
    prompt_logprobs: top candidates per prompt position whose log-probabilities the engine sends back once
    (PromptLogprobs; None: none; 0: the prompt token's own only; -1: the whole vocabulary)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    logit_bias: dict[int, float] = {}
    n: int = 1
    logprobs: int | None = None
    constraint: Constraint | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] = []
    prompt_logprobs: int | None = None
    # the most reasoning tokens before the engine ends the reasoning (vLLM's thinking_token_budget; None: no limit)
    thinking_token_budget: int | None = None
    # vLLM's SamplingParams.extra_args (the request's vllm_xargs): for the engine's custom logits processors
    extra_args: dict[str, str | int | float | list[str | int | float]] | None = None
    # the request's own vLLM stream_interval (at least 1): its ids go to its worker every this many, or every
    # --stream-interval if that is larger (the vLLM source)
    stream_interval: int | None = None
    # vLLM's logprob_token_ids (completions): the ids whose logprobs each output position reports, in place of the
    # top `logprobs` candidates (None: the top ones)
    logprob_token_ids: list[int] | None = None


class RequestParams(msgspec.Struct, array_like=True, gc=False, frozen=True):
    """Generation parameters the engine needs, plus the detok parameters it forwards to the worker.
    priority: the engine's scheduling priority (lower runs earlier, with a priority scheduler). cache_salt: mixed
    into the engine's prefix-cache keys, so only requests with the same salt share cached prompt blocks.
    engine_max_tokens: the client gave no max_tokens and the engine applies its own default (vLLM's: the rest of
    the context, capped by the generation config); max_tokens then holds the front's upper bound.
    lora: the LoRA adapter the request runs on (a name the engine loaded; "" = the base model).
    session_id: the request's conversation or agent session (vLLM's, given to its engine core).
    report_cached: the engine sends the rid's front how many prompt tokens its prefix cache held (PromptCached)."""

    max_tokens: int
    detok: DetokParams = DetokParams()
    ignore_eos: bool = False
    sampling: SamplingParams = SamplingParams()
    priority: int = 0
    cache_salt: str | None = None
    engine_max_tokens: bool = False
    lora: str = ""
    session_id: str | None = None
    report_cached: bool = False


# ---- front -> engine -------------------------------------------------------------------------------


class Submit(msgspec.Struct, tag="submit", array_like=True, gc=False):
    """front: the index of the front process that sent it (front.processes > 1); the rid's text goes to it."""

    rid: str
    prompt_ids: list[int]
    params: RequestParams
    sent_ns: int = 0
    front: int = 0


class FrontHello(msgspec.Struct, tag="front_hello", array_like=True, gc=False):
    """A front process (re)started: the requests of an earlier process with this index lost their clients, so the
    engine aborts them."""

    front: int
    pid: int


class Abort(msgspec.Struct, tag="abort", array_like=True, gc=False):
    rid: str
    reason: str = FINISH_ABORT


class Delivered(msgspec.Struct, tag="delivered", array_like=True, gc=False):
    """The front has the rid's final delta: the engine may forget the rid. Until then an engine keeps an ended
    rid's history, so that it can re-open the rid if its worker dies before the final text reached the front."""

    rid: str


class AdapterCall(msgspec.Struct, tag="adapter_call", array_like=True, gc=False):
    """Load (`path` given) or unload (`path` "") the LoRA adapter `name` in the engine at run time (vLLM's
    /v1/load_lora_adapter and /v1/unload_lora_adapter). The engine answers the calling front with an AdapterAnswer
    of the same `call` id. load_inplace: replace an adapter of that name (else loading a known name is refused);
    is_3d: the adapter's MoE weights are stored as 3D tensors (vLLM's is_3d_lora_weight)."""

    call: str
    front: int
    name: str
    path: str = ""
    load_inplace: bool = False
    is_3d: bool = False


# ---- engine -> worker ------------------------------------------------------------------------------


class Open(msgspec.Struct, tag="open", array_like=True, gc=False):
    """Starts (or, after a worker died, re-starts) a rid on a worker. Always precedes the rid's first row in
    the same TokenBatch. On a re-open the following row carries the full token history; the
    worker decodes it from the start and the front drops what it already sent (by TextDelta.offset)."""

    rid: str
    prompt_tail: list[int]
    params: DetokParams
    front: int = 0  # the front process the rid's TextDeltas go to (Submit.front)
    # the engine's vocabulary size (its model's output ids), when it knows it: an id in [0, vocab_size) that the
    # tokenizer lacks (a model's embedding table is often padded past its tokenizer) decodes to no text, as the
    # tokenizer's full decode drops it; 0: unknown, every id the tokenizer lacks is an error
    vocab_size: int = 0


class TokenLogprob(msgspec.Struct, array_like=True, gc=False, frozen=True):
    """The engine's log-probability of one output id (Tokens.logprobs[i] is about Tokens.ids[i]), and its top
    candidates at that position: top_ids[j] with top_logprobs[j] (SamplingParams.logprobs of them)."""

    logprob: float
    top_ids: list[int] = []
    top_logprobs: list[float] = []


class Tokens(msgspec.Struct, array_like=True, gc=False):
    """New output ids of one rid for one step (none, one or more), as the engine plans them; the rid is the row's
    (TokenBatch.rids, or beside it: TokenRow). finish is set on the rid's last ids (EOS, max_tokens, abort, engine
    error); the worker then flushes and frees the rid. `error`: with finish "error", the engine's message for the
    client (the worker's final delta carries it, so the client reads the cause whichever of that delta and the
    engine's Reject reaches the front first). `logprobs`: only for a request that asked for them (None otherwise),
    one entry per id. A TokenBatch row other than a plain one (one id, nothing else) carries its Tokens in
    TokenBatch.extras."""

    ids: list[int]
    finish: str | None = None
    error: str | None = None
    logprobs: list[TokenLogprob] | None = None


class TokenBatch(msgspec.Struct, tag="token_batch", array_like=True, gc=False):
    """One engine step for one worker: its Opens, then one row per rid with output, in order, as columns. Row i is
    rid `rids[i]` with the one new id `ids[i]`, unless `extras` has row i: then its Tokens are there (and `ids[i]` is
    0, unread). A worker takes the rows in order."""

    step: int
    sent_ns: int
    opens: list[Open]
    rids: list[str] = []
    ids: list[int] = []
    extras: dict[int, Tokens] = {}


class Shutdown(msgspec.Struct, tag="shutdown", array_like=True, gc=False):
    """Engine asks a worker to leave gracefully (after handing its rids elsewhere), or with `rejoin` to forget
    every rid it holds and register again (its rids are stale: the engine declared it dead or restarted)."""

    reason: str = ""
    rejoin: bool = False


# ---- worker -> engine ------------------------------------------------------------------------------


class Hello(msgspec.Struct, tag="hello", array_like=True, gc=False):
    worker: str
    pid: int


class Heartbeat(msgspec.Struct, tag="heartbeat", array_like=True, gc=False):
    """step: the last TokenBatch step the worker has handled (-1: none yet); blocked: it is waiting for the front
    to take a TextBatch (backpressure), so unread TokenBatches are not its fault. A worker whose heartbeats show
    no progress on the batches sent to it for engine.batch_answer_timeout_s is declared dead."""

    worker: str
    load: int  # live rids on this worker
    step: int = -1
    blocked: bool = False


class Finish(msgspec.Struct, tag="finish", array_like=True, gc=False):
    """A worker found a stop (string or token) or a bad token id: the engine stops generating the rid. n_tokens: the
    generated ids the rid kept (its client's completion tokens; ids the engine made past the stop are not among
    them), -1 when not said. A rid with stop strings that the engine ended gets one too, after its last ids: how it
    ended for its client (a stop string found in them, or the engine's own finish) and the ids kept."""

    rid: str
    reason: str
    stop_reason: str | int | None = None
    n_tokens: int = -1


class Goodbye(msgspec.Struct, tag="goodbye", array_like=True, gc=False):
    """A worker leaves gracefully; the engine re-opens its live rids elsewhere."""

    worker: str


# ---- worker -> front -------------------------------------------------------------------------------


class ToolCallDelta(msgspec.Struct, array_like=True, gc=False, frozen=True):
    """A piece of tool call `index` (0, 1, ... in the order the model wrote them): `name` on the call's first
    piece only ("" after), `arguments` a fragment of its arguments JSON starting at `arguments_offset`; `id` the
    call's id as the model wrote it, with `name` ("" when the model writes none: the front makes one)."""

    index: int
    name: str
    arguments: str
    arguments_offset: int
    id: str = ""


class ParsedDelta(msgspec.Struct, array_like=True, gc=False):
    """A TextDelta's text split by the request's parsers. Each channel has its own offset (characters of that
    channel emitted before this delta), so a receiver drops re-sent parts per channel, as with `offset`."""

    content: str
    content_offset: int
    reasoning: str = ""
    reasoning_offset: int = 0
    tool_calls: list[ToolCallDelta] = []
    # the request's reasoning tokens so far, as vLLM counts them (parse/reasoning.py, ReasoningTokenCount; 0 where the
    # parser has no count): a running total, so a re-sent delta carries the same value
    reasoning_tokens: int = 0


class LogprobText(msgspec.Struct, array_like=True, gc=False, frozen=True):
    """One output token's logprob as the client sees it: `token` is the tokenizer's decode of the id alone (special
    tokens kept), `token_bytes` the token's own bytes in the output (a piece of a character for a token that
    splits one), `top` the engine's top candidates, most likely first (their `top` is empty), `token_id` its id (-1 =
    not given): a client's return_tokens_as_token_ids writes it in place of the string."""

    token: str
    token_bytes: bytes
    logprob: float
    top: list[LogprobText] = []
    token_id: int = -1


class TextExtras(msgspec.Struct, kw_only=True, array_like=True, gc=False):
    """What a delta carries beyond its text (a TextBatch row's extras). finish / stop_reason / error are set on the
    rid's last delta; engine_failed (True, else None) with finish "error": the engine failed the rid (Tokens.error),
    not the worker, so the front answers it as it answers the engine's Reject of the rid, whichever comes first.
    parsed: the split of the text into channels when the request names a parser (None otherwise). logprobs: for a
    request that asked for them, the entries of the tokens consumed since the rid's previous delta, i.e. of tokens
    n_tokens - len(logprobs) .. n_tokens - 1 (the receiver drops re-sent ones by that index). token_ids: for a
    request whose DetokParams ask for them, the ids of those same tokens (the same index rule)."""

    finish: str | None = None
    stop_reason: str | int | None = None
    error: str | None = None
    parsed: ParsedDelta | None = None
    logprobs: list[LogprobText] | None = None
    token_ids: list[int] | None = None
    engine_failed: bool | None = None


class TextDelta(TextExtras, array_like=True, gc=False):
    """New text of one rid (a TextBatch row, with its extras as keywords). offset: character offset in the rid's
    output text at which `text` starts. n_tokens: output tokens consumed so far for this rid (cumulative, so
    re-sent deltas do not double count)."""

    rid: str
    offset: int
    text: str
    n_tokens: int


class TextBatch(msgspec.Struct, tag="text_batch", array_like=True, gc=False):
    """A worker's answer to one TokenBatch: one row per delta, in order, as columns. Row i is
    TextDelta(rids[i], offsets[i], texts[i], n_tokens[i]) plus `extras[i]` where a row has more than text (a
    finish, parsed channels, logprobs, token ids). A receiver takes the rows in order (bus/columns.py)."""

    worker: str
    sent_ns: int
    step: int
    rids: list[str] = []
    offsets: list[int] = []
    texts: list[str] = []
    n_tokens: list[int] = []
    extras: dict[int, TextExtras] = {}


class WorkerStats(msgspec.Struct, tag="worker_stats", array_like=True, gc=False):
    worker: str
    pid: int
    live_rids: int
    bad_frames: dict[str, int]
    tokens_in: int
    chars_out: int


# ---- engine -> front -------------------------------------------------------------------------------


# Reject kinds: why the engine refused a request at admission, before any of its output, for the front to answer
# with a status (the message is for people: never matched). "" = not said (an engine failure, an older engine).
REJECT_FAILED = ""
REJECT_INVALID = "invalid"  # the request is outside the engine's limits or stop rules: 400
REJECT_STOP_BUDGET = "stop_budget"  # no worker has room for its stop strings (worker.max_live_stop_chars): 429
REJECT_NO_WORKER = "no_worker"  # no detok worker is alive to take it: 503


class Reject(msgspec.Struct, tag="reject", array_like=True, gc=False):
    """The engine could not take or finish a request (no live worker, bad params): ends it with an error.
    With `param` the front answers 400 naming that request parameter (the engine cannot honour it); `kind` (one of
    the REJECT_* above) says why a request was refused at admission, before any of its output: its client gets
    that status rather than a stream that ends with an error."""

    rid: str
    error: str
    param: str | None = None  # set when a request parameter is what the engine cannot honour (the client's fault)
    kind: str = REJECT_FAILED


class PromptLogprobs(msgspec.Struct, tag="prompt_logprobs", array_like=True, gc=False):
    """The engine's log-probabilities of a request's prompt tokens (SamplingParams.prompt_logprobs), sent once to
    the rid's front, before or around its first output. Row i is about prompt token i + 1 (the first has none):
    `token_ids[i]` holds that prompt token's id then the engine's top candidates at that position, `logprobs[i]`
    their log-probabilities, `ranks[i]` the prompt token's rank in the vocabulary (1 = the most likely). Rows of
    one message have one width. The front decodes the ids (it has the tokenizer)."""

    rid: str
    token_ids: list[list[int]]
    logprobs: list[list[float]]
    ranks: list[int]


class PromptCached(msgspec.Struct, tag="prompt_cached", array_like=True, gc=False):
    """How many of a request's prompt tokens the engine's prefix cache held, and how many its prefill computed and
    wrote to it (RequestParams.report_cached), sent once to the rid's front when its prefill is done: the usage's
    prompt_tokens_details."""

    rid: str
    cached_tokens: int
    created_cache_tokens: int = 0


class EngineStats(msgspec.Struct, tag="engine_stats", array_like=True, gc=False):
    live_rids: int
    workers: dict[str, int]  # live worker id -> live rids assigned
    bad_frames: dict[str, int]
    aborted: int
    reopened: int
    generated: int = 0  # ids the engine pushed as it generated them (EngineLink.push), since it started
    # connections the engine's receiving sockets lost: a frame over bus.max_message_bytes, or a peer going away
    dropped_connections: int = 0
    served_model_name: str = ""  # the model name the engine serves ("" = it names none): the front serves it too
    max_model_len: int = 0  # the engine's context length (0 = not reported): the front reports it
    engine_version: str = ""  # the real engine's version (vLLM's), which /version reports ("" = none)
    # the model's vocabulary size when larger than the tokenizer's (0 = not reported): sampling fields may name
    # any id below it (allowed_token_ids, logit_bias), as the engine samples them
    vocab_size: int = 0
    # the real engine's system_fingerprint (vLLM's --fingerprint-mode), which the fronts' responses carry ("" = none)
    system_fingerprint: str = ""
    # the LoRA adapters loaded in the engine, name -> path: each served as a model (None: the engine loads none)
    lora_adapters: dict[str, str] | None = None
    # workers the engine declared lost since it started (silent, unanswered, unreachable, restarted; not Goodbye)
    lost_workers: int = 0
    # the request fields (bus/request_fields.py names) this engine does not pass on: the fronts refuse a request
    # that sets one (a 400 naming it) instead of accepting what the engine would ignore
    refused_fields: list[str] = msgspec.field(default_factory=list)
    # the model's sampling defaults (vLLM's generation-config ones: temperature, top_p, max_tokens, ...), which a
    # request that leaves a field out gets; the fronts echo them where vLLM's server does (the Responses object)
    sampling_defaults: dict[str, int | float] = msgspec.field(default_factory=dict)


class AdapterAnswer(msgspec.Struct, tag="adapter_answer", array_like=True, gc=False):
    """The engine's answer to an AdapterCall: `status` 200 (done), 400 (the call is invalid), 404 (no such
    adapter, or none at that path) or 500 (the engine failed to load it); `message` says what happened, as vLLM's
    server says it; `lora_adapters` is the engine's table after the call (as in EngineStats)."""

    call: str
    status: int
    message: str
    lora_adapters: dict[str, str] = {}


ToEngine = FrontHello | Submit | Abort | Delivered | AdapterCall | Hello | Heartbeat | Finish | Goodbye
ToWorker = TokenBatch | Shutdown
ToFront = TextBatch | WorkerStats | Reject | PromptLogprobs | PromptCached | EngineStats | AdapterAnswer
