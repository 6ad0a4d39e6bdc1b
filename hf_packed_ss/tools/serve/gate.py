"""What a request passes before the endpoints see it: its key, the server's state, its size.

`Gate` is plain ASGI middleware in front of the app, so each check answers before the body is parsed (or, for the
size, read whole), in OpenAI's error shape:
1. the key (`--api-key`): every path but `/health` needs `Authorization: Bearer KEY`, else 401; the key is compared
   in constant time (`hmac.compare_digest`), so the time to refuse says nothing of how much of a guess was right;
2. draining (SIGTERM, `drain.py`): 503 with `Retry-After`;
3. the size (`--max-request-bytes`): a `Content-Length` over the limit is refused 413 at once, and a body sent
   without one (chunked) is read only until it passes the limit. The 413 goes out first; then what the client
   still sends is discarded (never kept) for at most `LINGER_S`, as nginx's lingering close does, since a client
   that is still sending when the connection closes under it (urllib does) reads a reset instead of the 413.
It also counts the requests in flight, which a drain waits for."""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import time
from dataclasses import dataclass

from .protocol import error_body

OPEN_PATHS = ("/health",)
LINGER_S = 2.0  # how long the rest of a refused body is discarded before the connection closes


@dataclass
class ServerState:
    """What the gate and the drain share: whether the server is draining, until when, and the requests in flight
    (past the gate, not yet answered)."""

    draining: bool = False
    drain_until: float = 0.0  # time.monotonic() at which the drain ends
    in_flight: int = 0

    def retry_after(self) -> int:
        return max(1, math.ceil(self.drain_until - time.monotonic()))


def authorised(headers: list[tuple[bytes, bytes]], key: bytes) -> bool | None:
    """True for `Authorization: Bearer KEY`; False for another key; None for no key at all."""
    value = next((v for k, v in headers if k == b"authorization"), None)
    if value is None:
        return None
    scheme, _, token = value.strip().partition(b" ")
    # compare_digest on the token whatever the scheme, so a wrong scheme takes as long as a wrong key
    same = hmac.compare_digest(token.strip(), key)
    return same and scheme.lower() == b"bearer"


async def answer(send, status: int, body: dict, headers: list[tuple[bytes, bytes]] = (), then=None) -> None:
    """A JSON answer straight to ASGI `send`; `Connection: close`, since the body may be unread. `then`: awaited
    once the answer has gone out, before the response ends (and the connection with it)."""
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            (b"connection", b"close"), *headers]})
    await send({"type": "http.response.body", "body": data, "more_body": then is not None})
    if then is not None:
        await then
        await send({"type": "http.response.body", "body": b""})


async def linger(receive, seconds: float = LINGER_S) -> None:
    """Discard the rest of a request body until it ends, the client leaves, or `seconds` have passed."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        try:
            message = await asyncio.wait_for(receive(), left)
        except asyncio.TimeoutError:
            return
        if message["type"] == "http.disconnect" or not message.get("more_body", False):
            return


class TooLarge(Exception):
    """A body past the limit; `more`: whether the client has more of it to send."""

    def __init__(self, more: bool):
        super().__init__()
        self.more = more


class Gate:
    """ASGI middleware: key, drain, size (in that order), then the app, with `state.in_flight` counted."""

    def __init__(self, app, state: ServerState, api_key: str | None, max_request_bytes: int):
        self.app, self.state, self.max_request_bytes = app, state, max_request_bytes
        self.key = None if api_key is None else api_key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        # 1. the key, before anything of the request is read
        if self.key is not None:
            ok = authorised(scope["headers"], self.key)
            if not ok:
                message = ("Incorrect API key provided." if ok is False else "You didn't provide an API key.") + (
                    " Send the server's key as `Authorization: Bearer KEY` (the openai client: api_key=KEY).")
                return await answer(send, 401, error_body(message, 401, code="invalid_api_key"),
                                    [(b"www-authenticate", b"Bearer")])
        # 2. a draining server takes nothing new
        if self.state.draining:
            after = self.state.retry_after()
            return await answer(send, 503, error_body(f"The server is shutting down: retry in {after} s (or on "
                                                      "another replica).", 503),
                                [(b"retry-after", str(after).encode())])
        # 3. the size, read no further than the limit
        if scope["method"] in ("POST", "PUT", "PATCH"):
            try:
                receive = await self.bounded(scope, receive)
            except TooLarge as large:
                return await answer(send, 413, error_body(
                    f"The request body is over this server's limit of {self.max_request_bytes} bytes: send a "
                    "shorter prompt (or start the server with a larger --max-request-bytes).", 413),
                                    then=linger(receive) if large.more else None)
            if receive is None:
                return  # the client left while it sent the body
        self.state.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.state.in_flight -= 1

    async def bounded(self, scope, receive):
        """The body, read up to the limit (`TooLarge` past it), as a `receive` that replays it and then defers to
        the client's (so the app still hears a disconnect); None if the client disconnected."""
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if declared is not None and declared.isdigit() and int(declared) > self.max_request_bytes:
            raise TooLarge(more=True)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_request_bytes:
                raise TooLarge(more=message.get("more_body", False))
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replayed():
            return replay.pop() if replay else await receive()

        return replayed
