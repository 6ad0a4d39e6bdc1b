"""The OpenAI-compatible HTTP API: `/v1/completions`, `/v1/chat/completions` (streamed as server-sent events or
whole), `/v1/models` and `/health`, over one `Batcher`.

A request first passes the `Gate` (key, drain, size: `gate.py`), then is parsed and checked (`protocol.parse`, then
`check_generate`, which raises what `generate` would) before it joins the queue, so a bad one is answered 4xx with
the reason and never reaches a batch. A client that leaves frees its row at once, streamed or whole."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from ...front import check_generate
from .batcher import Batcher, Ticket
from .gate import Gate, ServerState
from .protocol import RequestError, chunk, parse, parse_json, response


def build_app(model, tokenizer, name: str, batcher: Batcher, context: int | None, *, api_key: str | None = None,
              max_request_bytes: int = 4 << 20, request_timeout_s: float | None = None,
              state: ServerState | None = None) -> Gate:
    """The app serving `model` as `name` behind its `Gate`; `context`: the longest prompt + max_tokens a request
    may ask; `request_timeout_s`: the longest a request may take from arrival (its own `request_timeout_s` may be
    shorter); `state`: shared with the drain."""
    created = int(time.time())
    state = ServerState() if state is None else state

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        await run_in_threadpool(batcher.stop)  # the batch in flight finishes; waiting requests get 503

    app = FastAPI(title=f"hf_packed_ss: {name}", lifespan=lifespan)

    def check(job) -> None:
        try:
            check_generate(model, torch.tensor([job.prompt_ids]), max_new_tokens=job.max_tokens,
                           pad_token_id=batcher.pad, streamer=[None], **job.options)
        except (ValueError, TypeError) as error:
            raise RequestError(str(error)) from None

    async def serve(request: Request, chat: bool):
        try:
            job = parse(parse_json(await request.body()), chat, tokenizer, model.generation_config, context, name)
            await run_in_threadpool(check, job)
            bounds = [t for t in (request_timeout_s, job.timeout_s) if t is not None]
            ticket = Ticket(job, asyncio.get_running_loop(), timeout_s=min(bounds) if bounds else None)
            batcher.submit(ticket)
        except RequestError as error:  # a full queue (503) says when to come back
            return JSONResponse(error.body(), status_code=error.status,
                                headers={"Retry-After": "1"} if error.status == 503 else None)
        if job.stream:
            return StreamingResponse(events(ticket), media_type="text/event-stream")
        return await whole(ticket, request)

    async def whole(ticket: Ticket, request: Request):
        """The answer in one JSON; a client that disconnects while it waits frees its row at once (its disconnect
        is awaited beside the answer, not polled)."""
        gone = asyncio.ensure_future(disconnected(request))
        try:
            while True:
                event = asyncio.ensure_future(ticket.events.get())
                await asyncio.wait({event, gone}, return_when=asyncio.FIRST_COMPLETED)
                if not event.done():
                    event.cancel()
                    ticket.cancelled = True
                    return Response(status_code=499)  # nobody reads it
                kind, value = event.result()
                if kind == "error":
                    return JSONResponse(value.body(), status_code=value.status)
                if kind == "end":
                    job = ticket.job
                    return JSONResponse(response(job, name, value["text"], value["finish_reason"], value["tokens"],
                                                 value["stats"]))
        finally:
            gone.cancel()

    async def disconnected(request: Request) -> None:
        """Returns when the client has gone (the body was read: the next message is the disconnect)."""
        while (await request.receive())["type"] != "http.disconnect":
            pass

    async def events(ticket: Ticket) -> AsyncIterator[str]:
        """Server-sent events in OpenAI's chunk format, then `data: [DONE]`; a disconnect cancels the row."""
        job, finished = ticket.job, False
        try:
            while True:
                kind, value = await ticket.events.get()
                if kind == "text":
                    yield chunk(job, name, value)
                elif kind == "end":
                    finished = True
                    yield chunk(job, name, None, value["finish_reason"], value["stats"], value["tokens"])
                    break
                else:
                    finished = True
                    yield f"data: {JSONResponse(value.body()).body.decode()}\n\n"
                    break
            yield "data: [DONE]\n\n"
        finally:
            if not finished:
                ticket.cancelled = True

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await serve(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await serve(request, chat=True)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": name, "object": "model", "created": created,
                                            "owned_by": "hf_packed_ss"}]}

    @app.get("/health")
    async def health():
        """Open (no key). 503 while unhealthy (the worker is gone) or draining, so a balancer stops sending."""
        status = "draining" if state.draining else "ok" if batcher.healthy else "unhealthy"
        body = {"status": status, "active_rows": batcher.active_rows, "waiting": batcher.queued,
                "batches": batcher.batches, "rows": batcher.rows, "rows_joined": batcher.rows_joined,
                "rows_cancelled": batcher.rows_cancelled, "rows_timed_out": batcher.rows_timed_out,
                "tokens_decoded": batcher.tokens_decoded, "failures": batcher.failures}
        return JSONResponse(body, status_code=200 if status == "ok" else 503)

    return Gate(app, state, api_key, max_request_bytes)
