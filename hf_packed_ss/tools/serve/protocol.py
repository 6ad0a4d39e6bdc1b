"""OpenAI's request and response formats, mapped onto `generate` options.

A request body becomes a `Job`: the prompt's ids, the `generate` options (the model's generation config fills in
what the request leaves out) and how to answer. Its `key` groups jobs that can share one batched `generate` call:
everything but the prompt and the token limit. Responses and stream chunks are plain dicts in OpenAI's shape, so
the `openai` client reads them, with our `decoding_stats` beside the usage."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

# extra_body fields (top-level JSON fields once the client merges them): our decoding options
DECODING_FIELDS = ("assistant_mode", "speculative_width", "verify_order", "speculative_branches")
# OpenAI fields we cannot honour; answered 400 rather than silently ignored, since each would change the output
UNSUPPORTED = {"logprobs": (None, False, 0), "top_logprobs": (None, 0), "echo": (None, False), "best_of": (None, 1),
               "n": (None, 1), "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
               "logit_bias": (None, {}), "suffix": (None, ""), "tools": (None, []),
               "response_format": (None, {"type": "text"})}
# our fields about serving, not decoding: `request_timeout_s` (seconds; it may shorten the server's
# --request-timeout-s, never lengthen it)
SERVING_FIELDS = ("request_timeout_s",)
# OpenAI fields that do not change the tokens
IGNORED = {"user", "metadata", "store", "service_tier", "parallel_tool_calls", "tool_choice", "stream_options",
           "model", "stream", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p",
           "seed", "stop"}


class RequestError(Exception):
    """A request the server refuses: HTTP `status` and a message that says what to do."""

    def __init__(self, message: str, status: int = 400, param: str | None = None):
        super().__init__(message)
        self.message, self.status, self.param = message, status, param

    def body(self) -> dict:
        return error_body(self.message, self.status, self.param)


def error_body(message: str, status: int, param: str | None = None, code: str | int | None = None) -> dict:
    """OpenAI's error shape; `code` defaults to the HTTP status."""
    kind = "invalid_request_error" if status < 500 else "overloaded_error" if status == 503 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": status if code is None else code}}


@dataclass
class Job:
    """One request, parsed: what `generate` is asked and how the answer is shaped."""

    chat: bool
    prompt_ids: list[int]
    max_tokens: int
    options: dict  # generate kwargs shared by a batch (mode, width, order, sampling)
    stop: list[str]
    stream: bool
    include_usage: bool
    seed: int | None
    timeout_s: float | None = None  # the request's own bound (`request_timeout_s`); the server may bound it more
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def key(self) -> str:
        """Jobs with one key can be decoded in one batch: the same options and stop strings. A seeded sampled
        job decodes alone, so its seed reproduces what `generate` gives with that seed."""
        alone = self.seed if self.options.get("do_sample") else None
        return json.dumps([self.options, self.stop, alone, None if alone is None else self.id], sort_keys=True)


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def parse_json(raw: bytes) -> dict:
    """The body as a dict, or a 400 saying why not: bytes that are not UTF-8, text that is not JSON (NaN and
    Infinity included, which Python's json would take), nesting too deep to read."""
    try:
        body = json.loads(raw, parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as error:  # JSONDecodeError is a ValueError
        reason = "nested too deeply" if isinstance(error, RecursionError) else str(error)
        raise RequestError(f"The request body is not valid JSON ({reason}): send a JSON object, e.g. "
                           '{"model": "...", "prompt": "Hello", "max_tokens": 16}.') from None
    if not isinstance(body, dict):
        raise RequestError(f"The request body must be a JSON object, not {type(body).__name__}.")
    return body


def _number(body: dict, name: str, kind: type, low: float, high: float | None = None):
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or (kind is int and not isinstance(value, int)):
        raise RequestError(f"{name} must be {'an integer' if kind is int else 'a number'}, got {value!r}.", param=name)
    if value < low or (high is not None and value > high):
        span = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise RequestError(f"{name}={value} is out of range: it must be {span}.", param=name)
    return kind(value)


def parse(body: dict, chat: bool, tokenizer, generation_config, context: int | None, model: str) -> Job:
    """The request as a `Job`, or a `RequestError` saying what to fix. `context`: the model's context length (a
    prompt plus max_tokens must fit)."""
    if body.get("model") not in (None, model):
        raise RequestError(f"The model {body['model']!r} is not served here; this server serves {model!r} "
                           "(GET /v1/models).", status=404, param="model")
    for name, allowed in UNSUPPORTED.items():
        if name in body and body[name] not in allowed:
            raise RequestError(f"{name}={body[name]!r} is not supported by this server: drop it (every request "
                               "decodes one sequence exactly as generate would).", param=name)
    unknown = sorted(set(body) - IGNORED - set(UNSUPPORTED) - set(DECODING_FIELDS) - set(SERVING_FIELDS))
    if unknown:
        raise RequestError(f"Unknown request fields {unknown}: OpenAI's fields, or {list(DECODING_FIELDS)} "
                           "(in the openai client: extra_body={...}).", param=unknown[0])
    ids = chat_ids(body, tokenizer) if chat else prompt_ids(body, tokenizer)
    if not ids:
        raise RequestError("The prompt is empty: send at least one token of text.", param="prompt")
    limit = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _number(body, limit, int, 1)
    if max_tokens is None:
        max_tokens = generation_config.max_new_tokens or 16
    if context is not None and len(ids) >= context:
        raise RequestError(f"The prompt has {len(ids)} tokens and the model's context is {context}: shorten the "
                           f"prompt to at most {context - 1} tokens.", param="messages" if chat else "prompt")
    if context is not None and len(ids) + max_tokens > context:
        raise RequestError(f"The prompt has {len(ids)} tokens; with {limit}={max_tokens} that exceeds the model's "
                           f"context of {context} tokens: shorten the prompt or lower {limit}.", param=limit)
    options = {k: body[k] for k in DECODING_FIELDS if body.get(k) is not None}
    temperature, top_p = _number(body, "temperature", float, 0, 2), _number(body, "top_p", float, 0, 1)
    if temperature is not None:  # OpenAI's meaning: 0 is greedy, more samples at that temperature
        options["do_sample"] = temperature > 0
        if temperature > 0:
            options["temperature"] = temperature
    if top_p is not None and top_p < 1:
        options["top_p"] = top_p
    seed = _number(body, "seed", int, 0, 2**63 - 1)
    stop = body.get("stop")
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 4:
        raise RequestError("stop must be a non-empty string or a list of at most 4 of them.", param="stop")
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise RequestError(f"stream must be true or false, got {stream!r}.", param="stream")
    usage = body.get("stream_options") or {}
    if not isinstance(usage, dict):
        raise RequestError("stream_options must be an object such as {\"include_usage\": true}.")
    timeout = _number(body, "request_timeout_s", float, 0)
    if timeout == 0:
        raise RequestError("request_timeout_s must be > 0 seconds.", param="request_timeout_s")
    return Job(chat=chat, prompt_ids=ids, max_tokens=max_tokens, options=options, stop=stop, stream=stream,
               include_usage=bool(usage.get("include_usage")), seed=seed, timeout_s=timeout)


def _encode(tokenizer, text: str, param: str) -> list[int]:
    try:
        return tokenizer(text).input_ids
    except (TypeError, ValueError) as error:  # text the tokenizer cannot take (a lone surrogate)
        raise RequestError(f"The {param} could not be tokenized ({error}): send valid Unicode text.",
                           param=param) from None


def prompt_ids(body: dict, tokenizer) -> list[int]:
    """/v1/completions: a string, or a list of token ids (one prompt per request)."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return _encode(tokenizer, prompt, "prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        if not all(0 <= t < len(tokenizer) for t in prompt):
            raise RequestError(f"prompt token ids must be in [0, {len(tokenizer)}).", param="prompt")
        return list(prompt)
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return _encode(tokenizer, prompt[0], "prompt")
    raise RequestError("prompt must be a string or a list of token ids (one prompt per request; send several "
                       "requests at once and the server batches them).", param="prompt")


def chat_ids(body: dict, tokenizer) -> list[int]:
    """/v1/chat/completions: the messages through the model's chat template, with the assistant turn opened."""
    messages = body.get("messages")
    if isinstance(messages, list):  # content as a list of text parts, as newer clients send it: one string
        messages = [{**m, "content": "".join(p["text"] for p in m["content"])}
                    if isinstance(m, dict) and isinstance(m.get("content"), list) and all(
                        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                        for p in m["content"]) else m for m in messages]
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages):
        raise RequestError('messages must be a non-empty list of {"role": ..., "content": "text"} objects '
                           '(content may also be a list of {"type": "text", "text": ...} parts).', param="messages")
    if not getattr(tokenizer, "chat_template", None):
        raise RequestError("This model has no chat template: use /v1/completions with a raw prompt, or restart the "
                           "server with --chat-template FILE.", param="messages")
    try:
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                  return_dict=True)["input_ids"])
    except Exception as error:  # a template that rejects these messages (roles, order) says why
        raise RequestError(f"The chat template rejected the messages: {error}", param="messages") from None


def _choice(job: Job, text: str | None, finish: str | None, delta: bool) -> dict:
    if not job.chat:
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
    if delta:
        return {"index": 0, "delta": {} if text is None else {"role": "assistant", "content": text},
                "logprobs": None, "finish_reason": finish}
    return {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": finish}


def _head(job: Job, model: str, chunk: bool) -> dict:
    kind = ("chat.completion.chunk" if chunk else "chat.completion") if job.chat else "text_completion"
    return {"id": ("chatcmpl-" if job.chat else "cmpl-") + job.id, "object": kind, "created": job.created,
            "model": model}


def usage(job: Job, completion_tokens: int) -> dict:
    prompt = len(job.prompt_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion_tokens, "total_tokens": prompt + completion_tokens}


def response(job: Job, model: str, text: str, finish: str, tokens: int, stats: dict) -> dict:
    return {**_head(job, model, False), "choices": [_choice(job, text, finish, False)], "usage": usage(job, tokens),
            "decoding_stats": stats}


def chunk(job: Job, model: str, text: str | None = None, finish: str | None = None, stats: dict | None = None,
          tokens: int | None = None) -> str:
    """One server-sent event; the last carries `finish_reason` and our `decoding_stats`, and a usage-only chunk
    (no choices) follows when the request asked for `stream_options.include_usage`."""
    payload = {**_head(job, model, True), "choices": [_choice(job, text, finish, True)]}
    if stats is not None:
        payload["decoding_stats"] = stats
    events = [payload]
    if tokens is not None and job.include_usage:
        events.append({**_head(job, model, True), "choices": [], "usage": usage(job, tokens)})
    return "".join(f"data: {json.dumps(e)}\n\n" for e in events)
