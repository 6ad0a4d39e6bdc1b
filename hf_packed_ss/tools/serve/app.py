"""The OpenAI-compatible HTTP API: `/v1/completions`, `/v1/chat/completions` (streamed as server-sent events or
whole), `/v1/models` and `/health`, over one `Batcher`.

A request is parsed and checked (`protocol.parse`, then `check_generate`, which raises what `generate` would) before
it joins the queue, so a bad one is answered 4xx with the reason and never reaches a batch."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from ...front import check_generate
from .batcher import Batcher, Ticket
from .protocol import RequestError, chunk, parse, parse_json, response


def build_app(model, tokenizer, name: str, batcher: Batcher, context: int | None) -> FastAPI:
    """The app serving `model` as `name`; `context`: the longest prompt + max_tokens a request may ask."""
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        await run_in_threadpool(batcher.stop)  # the batch in flight finishes; waiting requests get 503

    app = FastAPI(title=f"hf_packed_ss: {name}", lifespan=lifespan)

    def check(job) -> None:
        try:
            check_generate(model, torch.tensor([job.prompt_ids]), max_new_tokens=job.max_tokens,
                           pad_token_id=batcher.pad, streamer=[None], **job.options)
        except ValueError as error:
            raise RequestError(str(error)) from None

    async def serve(request: Request, chat: bool):
        try:
            job = parse(parse_json(await request.body()), chat, tokenizer, model.generation_config, context, name)
            await run_in_threadpool(check, job)
            ticket = Ticket(job, asyncio.get_running_loop())
            batcher.submit(ticket)
        except RequestError as error:
            return JSONResponse(error.body(), status_code=error.status)
        if job.stream:
            return StreamingResponse(events(ticket), media_type="text/event-stream")
        return await whole(ticket, request)

    async def whole(ticket: Ticket, request: Request):
        """The answer in one JSON; a client that disconnects while it waits frees its row."""
        while True:
            try:
                kind, value = await asyncio.wait_for(ticket.events.get(), timeout=0.5)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    ticket.cancelled = True
                    return JSONResponse({}, status_code=499)
                continue
            if kind == "error":
                return JSONResponse(value.body(), status_code=value.status)
            if kind == "end":
                job = ticket.job
                return JSONResponse(response(job, name, value["text"], value["finish_reason"], value["tokens"],
                                             value["stats"]))

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
        state = {"status": "ok" if batcher.healthy else "unhealthy", "waiting": batcher.queued,
                 "batches": batcher.batches, "rows": batcher.rows, "rows_joined": batcher.rows_joined,
                 "rows_cancelled": batcher.rows_cancelled,
                 "tokens_decoded": batcher.tokens_decoded, "failures": batcher.failures}
        return JSONResponse(state, status_code=200 if batcher.healthy else 503)

    return app
