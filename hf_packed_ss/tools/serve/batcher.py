"""Concurrent requests decoded together: a bounded queue, and one worker thread that owns the model.

The worker takes the first waiting job, waits up to `max_wait_s` for more (at most `max_batch_size`), and decodes
the jobs that share options (`Job.key`) in one batched `generate` call, whose rows are exactly what each prompt gets
alone (the engine's batch guarantee). Jobs that arrive meanwhile join the next batch. Each row has a `Row`
streamer: it turns tokens into text for its request, and turns `cancelled` (which frees the row in the engine)
when its client disconnects, when it reaches its own `max_tokens` (the batch decodes to the largest) or when its
text meets a stop string; what a row decoded past its own end is cut, so the answer equals a solo decode's.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass, field

import torch

from .protocol import Job, RequestError


class Row:
    """One request's row in a batch: a streamer (put/end, `cancelled`) that keeps the row's tokens within
    `max_tokens`, decodes them to text, holds back what could be the start of a stop string, and pushes
    each new piece of text to its request."""

    def __init__(self, ticket: Ticket, tokenizer, eos: set[int]):
        self.ticket, self.tokenizer, self.eos = ticket, tokenizer, eos
        self.ids: list[int] = []
        self.text, self.sent = "", 0
        self.finish: str | None = None
        self.prompt_seen = False

    @property
    def cancelled(self) -> bool:
        return self.finish is not None or self.ticket.cancelled

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:  # the first put is the prompt, as for transformers' streamers
            self.prompt_seen = True
            return
        if self.finish is not None:
            return
        job = self.ticket.job
        for token in value.reshape(-1).tolist():
            self.ids.append(token)
            if token in self.eos:
                self.finish = "stop"
                break
            if len(self.ids) >= job.max_tokens:
                self.finish = "length"
                break
        self.text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if job.stop:
            self._stop_strings(job.stop)
        self._flush(final=self.finish is not None)

    def end(self) -> None:
        if self.finish is None:
            self.finish = "stop" if self.ids and self.ids[-1] in self.eos else "length"
        self._flush(final=True)

    def _stop_strings(self, stops: list[str]) -> None:
        """Cut the text (and the tokens) at the first stop string; OpenAI leaves the stop string out."""
        hits = [i for i in (self.text.find(s) for s in stops) if i >= 0]
        if not hits:
            return
        cut = min(hits)
        while len(self.ids) > 1 and len(self.tokenizer.decode(self.ids[:-1], skip_special_tokens=True)) > cut:
            self.ids.pop()  # the fewest tokens whose text reaches the stop string
        self.text, self.finish = self.text[:cut], "stop"

    def _flush(self, final: bool) -> None:
        end = len(self.text)
        if not final:
            if self.text.endswith("\ufffd"):  # a character cut between tokens: wait for the rest
                return
            stops = self.ticket.job.stop
            held = max((k for s in stops for k in range(1, len(s)) if self.text.endswith(s[:k])), default=0)
            end -= held
        if end > self.sent:
            self.ticket.emit("text", self.text[self.sent : end])
            self.sent = end


@dataclass(eq=False)
class Ticket:
    """A job in flight: the request's event queue (text pieces, then its end or an error), fed from the worker
    thread, and whether its client left."""

    job: Job
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: bool = False

    def emit(self, kind: str, value) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))


class Batcher:
    """The queue and the worker thread. `submit` refuses (503) when `max_queue` jobs already wait."""

    def __init__(self, model, tokenizer, max_batch_size: int = 8, max_wait_s: float = 0.01, max_queue: int = 64):
        if max_batch_size < 1 or max_queue < 1 or max_wait_s < 0:
            raise ValueError("max_batch_size and max_queue must be >= 1 and max_wait_s >= 0.")
        self.model, self.tokenizer = model, tokenizer
        self.max_batch_size, self.max_wait_s = max_batch_size, max_wait_s
        self.waiting: queue.Queue[Ticket] = queue.Queue(maxsize=max_queue)
        eos = model.generation_config.eos_token_id
        self.eos = set() if eos is None else {eos} if isinstance(eos, int) else set(eos)
        self.pad = model.generation_config.pad_token_id
        if self.pad is None:
            self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos, default=0)
        self.batches, self.rows, self.failures = 0, 0, 0
        self.rows_cancelled, self.tokens_decoded = 0, 0  # rows whose client left; tokens the rows decoded
        self.running = True
        self.thread = threading.Thread(target=self._work, name="hf-packed-ss-batcher", daemon=True)
        self.thread.start()

    def submit(self, ticket: Ticket) -> None:
        if not self.running:
            raise RequestError("The server is shutting down: retry on another replica.", status=503)
        try:
            self.waiting.put_nowait(ticket)
        except queue.Full:
            raise RequestError(f"The server is at capacity ({self.waiting.maxsize} requests waiting): retry later, "
                               "or start it with a larger --max-queue.", status=503) from None

    def stop(self, timeout: float = 30.0) -> None:
        """Finish the batch in flight, answer every waiting job 503, and end the worker."""
        self.running = False
        self.thread.join(timeout)
        while True:
            try:
                ticket = self.waiting.get_nowait()
            except queue.Empty:
                break
            ticket.emit("error", RequestError("The server shut down before this request ran.", status=503))

    @property
    def healthy(self) -> bool:
        return self.thread.is_alive()

    def _work(self) -> None:
        while self.running:
            try:
                first = self.waiting.get(timeout=0.05)
            except queue.Empty:
                continue
            tickets, deadline = [first], time.monotonic() + self.max_wait_s
            while len(tickets) < self.max_batch_size:
                try:
                    tickets.append(self.waiting.get(timeout=max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    break
            groups: dict[str, list[Ticket]] = {}
            for t in tickets:
                if not t.cancelled:  # a client that left before its batch costs nothing
                    groups.setdefault(t.job.key, []).append(t)
            for group in groups.values():
                self._decode(group)

    def _decode(self, tickets: list[Ticket]) -> None:
        """One batched `generate` for jobs with one key; every ticket gets its end or an error, whatever happens."""
        rows = [Row(t, self.tokenizer, self.eos) for t in tickets]
        try:
            prompts = [torch.tensor(t.job.prompt_ids) for t in tickets]
            longest = max(p.numel() for p in prompts)
            ids = torch.full((len(prompts), longest), self.pad, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for b, p in enumerate(prompts):
                ids[b, longest - p.numel() :], mask[b, longest - p.numel() :] = p, 1
            job = tickets[0].job
            options = dict(job.options)
            if job.seed is not None and options.get("do_sample"):
                options["generator"] = torch.Generator().manual_seed(job.seed)
            out = self.model.generate(ids.to(self.model.device), attention_mask=mask.to(self.model.device),
                                      max_new_tokens=max(t.job.max_tokens for t in tickets), pad_token_id=self.pad,
                                      streamer=rows, return_dict_in_generate=True, **options)
            stats = out.decoding_stats
            per_row = stats.per_row if len(rows) > 1 else [stats]
            self.batches, self.rows = self.batches + 1, self.rows + len(rows)
            for row, own in zip(rows, per_row, strict=True):
                self.tokens_decoded += own.new_tokens
                self.rows_cancelled += row.ticket.cancelled
                row.ticket.emit("end", {"text": row.text, "finish_reason": row.finish, "tokens": len(row.ids),
                                        "stats": summary(stats, own, len(rows), len(row.ids))})
        except Exception as error:  # one bad batch must not take the server down: its requests get the reason
            self.failures += 1
            reason = error if isinstance(error, RequestError) else RequestError(
                f"Decoding failed: {type(error).__name__}: {error}", status=500)
            for t in tickets:
                t.emit("error", reason)


def summary(stats, row, batch_size: int, tokens: int) -> dict:
    """The decoding statistics a response carries: the row's own calls (as decoded alone; `tokens`, the ones
    its answer kept) and its batch's."""
    return {"assistant_mode": stats.schedule, "speculative_width": stats.width, "nfe": row.nfe,
            "tokens_per_nfe": round(tokens / row.nfe, 4) if row.nfe else 0.0, "batch_size": batch_size,
            "batch_nfe": stats.nfe}
