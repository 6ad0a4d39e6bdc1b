"""Concurrent requests decoded together: a bounded queue, and one worker thread that owns the model.

The worker takes the first waiting job, waits up to `max_wait_s` for more (at most `max_batch_size`), and decodes
the jobs that share options (`Job.key`) in one batched `generate` call, whose rows are exactly what each prompt gets
alone (the engine's batch guarantee). While it runs, jobs with the same options join it between two model calls
(`generate(..., admit=...)`, continuous batching) while there is room, until a job with other options has waited
`max_hold_s`: then the batch takes no more rows and that job runs next, so none starves. Each row has a `Row`
streamer: it turns tokens into text for its request, answers it as soon as the row ends, and turns `cancelled`
(which frees the row in the engine) when its client disconnects, when it reaches its own `max_tokens` (the first
rows decode to the largest of theirs), when its text meets a stop string or when its deadline passes (the request
timeout: it is answered with what it has, `finish_reason` "timeout"); what a row decoded past its own end is cut,
so the answer equals a solo decode's (a timed-out one, a prefix of it).

Faults: a batch whose `generate` raises answers its requests 500 and the worker goes on with the next; `cut()` (the
end of a drain) ends the rows in flight with what they have and refuses what waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from .protocol import Job, RequestError

log = logging.getLogger("hf_packed_ss.serve")


class Row:
    """One request's row in a batch: a streamer (put/end, `cancelled`) that keeps the row's tokens within
    `max_tokens`, decodes them to text, holds back what could be the start of a stop string, and pushes
    each new piece of text to its request."""

    def __init__(self, ticket: Ticket, tokenizer, eos: set[int]):
        self.ticket, self.tokenizer, self.eos = ticket, tokenizer, eos
        self.ids: list[int] = []
        self.text, self.sent = "", 0
        self.finish: str | None = None
        self.prompt_seen = self.ended = False
        self.stats = None

    @property
    def cancelled(self) -> bool:
        """Asked by the engine after every round: the row leaves the batch (with the tokens it has) once it has
        its answer, its client left or its deadline passed."""
        if self.finish is None and self.ticket.expired():
            self.finish = "timeout"
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

    def put_stats(self, stats) -> None:
        self.stats = stats

    def end(self) -> None:
        """The row ended: flush the text and answer its request."""
        if self.finish is None:
            self.finish = "stop" if self.ids and self.ids[-1] in self.eos else "length"
        self._flush(final=True)
        self.ended = True
        self.ticket.emit("end", {"text": self.text, "finish_reason": self.finish, "tokens": len(self.ids),
                                 "stats": summary(self.stats, len(self.ids))})

    def _stop_strings(self, stops: list[str]) -> None:
        """Cut the text (and the tokens) at the first stop string; OpenAI leaves the stop string out."""
        hits = [i for i in (self.text.find(s) for s in stops) if i >= 0]
        if not hits:
            return
        cut = min(hits)
        while len(self.ids) > 1 and any(s in self.tokenizer.decode(self.ids[:-1], skip_special_tokens=True)
                                        for s in stops):
            self.ids.pop()  # the fewest tokens whose text holds the stop string (the usage counts those)
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
    arrived: float = field(default_factory=time.monotonic)
    timeout_s: float | None = None  # from arrival to the deadline; None: none

    def expired(self) -> bool:
        return self.timeout_s is not None and time.monotonic() - self.arrived > self.timeout_s

    def emit(self, kind: str, value) -> None:
        with contextlib.suppress(RuntimeError):  # the event loop is gone (shutting down): nobody is waiting
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))

    def time_out(self) -> None:
        """Answer a request whose deadline passed before it got a row: no text, `finish_reason` "timeout"."""
        self.emit("end", {"text": "", "finish_reason": "timeout", "tokens": 0, "stats": {}})


class Batcher:
    """The queue and the worker thread. `submit` refuses (503) when `max_queue` jobs already wait."""

    def __init__(self, model, tokenizer, max_batch_size: int = 8, max_wait_s: float = 0.0, max_queue: int = 64,
                 max_hold_s: float = 1.0):
        if max_batch_size < 1 or max_queue < 1 or max_wait_s < 0:
            raise ValueError("max_batch_size and max_queue must be >= 1 and max_wait_s >= 0.")
        self.model, self.tokenizer = model, tokenizer
        self.max_batch_size, self.max_wait_s, self.max_hold_s = max_batch_size, max_wait_s, max_hold_s
        self.waiting: queue.Queue[Ticket] = queue.Queue()  # submitted, not yet seen by the worker
        self.max_queue, self.lock = max_queue, threading.Lock()
        eos = model.generation_config.eos_token_id
        self.eos = set() if eos is None else {eos} if isinstance(eos, int) else set(eos)
        self.pad = model.generation_config.pad_token_id
        if self.pad is None:
            self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos, default=0)
        self.pending: deque[Ticket] = deque()  # taken from the queue by the worker, not yet decoding
        # a static cache (`--compile`) holds max_batch_size rows: rows join into the free ones
        self.static = model.generation_config.cache_implementation == "static"
        self.batches, self.rows, self.failures = 0, 0, 0
        self.rows_cancelled, self.tokens_decoded = 0, 0  # rows whose client left; tokens the rows decoded
        self.rows_joined = 0  # rows that joined a running batch
        self.rows_timed_out = 0  # requests answered at their deadline
        self.decoding: list[Row] = []  # the running batch's rows (those that ended included)
        self.running = True
        self.thread = threading.Thread(target=self._work, name="hf-packed-ss-batcher", daemon=True)
        self.thread.start()

    def submit(self, ticket: Ticket) -> None:
        if not self.running:
            raise RequestError("The server is shutting down: retry on another replica.", status=503)
        with self.lock:
            if self.queued >= self.max_queue:
                raise RequestError(f"The server is at capacity ({self.max_queue} requests waiting): retry later, "
                                   "or start it with a larger --max-queue.", status=503)
            self.waiting.put_nowait(ticket)

    @property
    def queued(self) -> int:
        """Requests waiting for a row (in the queue, or taken by the worker and not yet decoding)."""
        return self.waiting.qsize() + len(self.pending)

    @property
    def active_rows(self) -> int:
        """Rows decoding now: in the running batch and not yet ended (a row whose client left or whose deadline
        passed ends after the round in flight)."""
        return sum(not r.ended for r in list(self.decoding))

    def cut(self, timeout: float = 5.0) -> None:
        """The end of a drain: the rows in flight end after this round with what they have (`finish_reason`
        "timeout"), the batch takes no new rows, and every waiting request is answered 503 (`stop`)."""
        self.running = False
        for row in list(self.decoding):
            row.ticket.timeout_s = 0.0
        self.stop(timeout)

    def stop(self, timeout: float = 30.0) -> None:
        """Finish the batch in flight, answer every waiting job 503, and end the worker."""
        self.running = False
        self.thread.join(timeout)
        for ticket in self.pending:
            ticket.emit("error", RequestError("The server shut down before this request ran.", status=503))
        self.pending = deque()
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
                self._next()
            except Exception as error:  # a fault outside a batch (`_decode` answers its own) must not stop the worker
                log.exception("the batch worker hit an error; it goes on")
                self.failures += 1
                reason = RequestError(f"The server failed to schedule this request: {type(error).__name__}: "
                                      f"{error}", status=500)
                for ticket in self.pending:  # answered, so that the same fault cannot repeat on them
                    ticket.emit("error", reason)
                self.pending = deque()

    def _drop_gone(self) -> None:
        """Forget pending requests whose client left; answer those whose deadline passed."""
        keep = deque()
        for t in self.pending:
            if t.cancelled:
                continue
            if t.expired():
                self.rows_timed_out += 1
                t.time_out()
                continue
            keep.append(t)
        self.pending = keep

    def _next(self) -> None:
        """Take the first waiting job, wait up to `max_wait_s` for more, and decode the ones that share its key."""
        try:
            self.pending.append(self.waiting.get(timeout=0.05))
        except queue.Empty:
            if not self.pending:
                return
        deadline = time.monotonic() + self.max_wait_s
        while len(self.pending) < self.max_batch_size:
            try:
                self.pending.append(self.waiting.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                break
        self._drop_gone()  # a client that left before its batch costs nothing
        live = list(self.pending)
        if not live:
            return
        key = live[0].job.key
        group = [t for t in live if t.job.key == key][: self.max_batch_size]
        self.pending = deque(t for t in live if t not in group)
        self._decode(group)

    def _admit(self, key: str, rows: list[Row]) -> list[tuple[torch.Tensor, int, Row]]:
        """Asked by the engine between two calls: waiting jobs with this batch's options, while there is room,
        up to the first job with other options."""
        while True:
            try:
                self.pending.append(self.waiting.get_nowait())
            except queue.Empty:
                break
        self._drop_gone()
        if not self.running:
            return []  # stopping: this batch ends with the rows it has
        now, room = time.monotonic(), self.max_batch_size - sum(not r.ended for r in rows)
        if room <= 0 or any(t.job.key != key and now - t.arrived > self.max_hold_s for t in self.pending):
            return []  # a job with other options has waited long enough: let this batch drain, it runs next
        new = [Row(t, self.tokenizer, self.eos) for t in self.pending if t.job.key == key][:room]
        taken = {id(r.ticket) for r in new}
        self.pending = deque(t for t in self.pending if id(t) not in taken)
        rows.extend(new)
        self.rows_joined += len(new)
        return [(torch.tensor(r.ticket.job.prompt_ids, device=self.model.device), r.ticket.job.max_tokens, r)
                for r in new]

    def _decode(self, tickets: list[Ticket]) -> None:
        """One batched `generate` for jobs with one key (and those that join it); every request gets its answer
        as its row ends, or an error, whatever happens."""
        rows = [Row(t, self.tokenizer, self.eos) for t in tickets]
        self.decoding = rows  # `_admit` appends to it: /health's active_rows
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
                options["generator"] = torch.Generator().manual_seed(job.seed)  # alone: nothing joins it
            else:
                options["admit"] = lambda: self._admit(job.key, rows)
                if self.static:
                    options["max_batch_size"] = self.max_batch_size
            self.model.generate(ids.to(self.model.device), attention_mask=mask.to(self.model.device),
                                max_new_tokens=max(t.job.max_tokens for t in tickets), pad_token_id=self.pad,
                                streamer=list(rows), **options)
            self.batches += 1
        except Exception as error:  # one bad batch must not take the server down: its requests get the reason
            self.failures += 1
            log.exception("a batch of %d requests failed", len(rows))
            reason = error if isinstance(error, RequestError) else RequestError(
                f"Decoding failed: {type(error).__name__}: {error}", status=500)
            for row in rows:
                if not row.ended:
                    row.ticket.emit("error", reason)
        finally:
            for row in rows:  # a row the engine never ended (it failed) decodes no more
                row.ended = True
            self.decoding = []
        self.rows += len(rows)
        self.tokens_decoded += sum(r.stats.new_tokens for r in rows if r.stats is not None)
        self.rows_cancelled += sum(r.ticket.cancelled for r in rows)
        self.rows_timed_out += sum(r.finish == "timeout" and not r.ticket.cancelled for r in rows)


def summary(stats, tokens: int) -> dict:
    """The decoding statistics an answer carries: its row's own calls (as decoded alone) and `tokens`, the ones
    its answer kept."""
    if stats is None:
        return {}
    return {"assistant_mode": stats.schedule, "speculative_width": stats.width, "nfe": stats.nfe,
            "tokens_per_nfe": round(tokens / stats.nfe, 4) if stats.nfe else 0.0}
