"""``hf-packed-ss serve MODEL``: an OpenAI-compatible server that decodes with Packed-SS (or any schedule a request
names), batching concurrent requests (`batcher.py`) behind the endpoints of `app.py`.

In front of users: `--api-key` (or $HF_PACKED_SS_API_KEY) closes every path but /health (401 before the body is
read; `gate.py`), `--max-request-bytes` refuses a large body 413 unread, a prompt past the context is refused 400
with the lengths, `--request-timeout-s` (or a request's shorter `request_timeout_s`) cuts a row and answers what it
has (`finish_reason` "timeout"), a client that leaves frees its row at once, a failed batch answers its requests
500 and the server goes on, and SIGTERM drains within `--drain-s` (`drain.py`). `faults.py` checks all of it under
load.

Why not `transformers serve`: its handlers run generation through its own managers (one `generate` at a time, or
continuous batching that calls the model's forward itself and bypasses our decoder), which live in the private
`transformers.cli.serving.utils`; batching our rows would mean patching them. The endpoints and chunk format are
OpenAI's, as transformers serve's are; the model loads the same way (`from_pretrained` of a local folder or a
bundled name, never the network)."""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import logging
import os
import sys
from pathlib import Path

import torch

from ..bench.command import DTYPES

API_KEY_ENV = "HF_PACKED_SS_API_KEY"  # the key, where a command line (seen in `ps`) should not hold it


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hf-packed-ss serve", description=__doc__.splitlines()[0])
    p.add_argument("model", help="a bundled checkpoint name (hf_packed_ss.bundled.names()) or a local folder")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default loopback only; 0.0.0.0 "
                   "listens on every interface)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None, help="the model id clients send (default: MODEL's name)")
    p.add_argument("--dtype", default="auto", choices=DTYPES, help="auto (default): bfloat16 where the hardware runs "
                   "it natively (CUDA, AVX512-BF16/AMX CPUs), else float32; float32/float64 keep every schedule "
                   "token-identical to AR, bfloat16 only AR to stock generate (a schedule may leave AR at a near-tie)")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, ...")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--assistant-mode", default=None, help="the schedule for requests that name none (default: the "
                   "model's generation config, else packed_ss); a request sets its own in extra_body")
    p.add_argument("--speculative-width", type=int, default=None, help="the default width W")
    p.add_argument("--max-batch-size", type=int, default=8, help="most requests decoded in one batch")
    p.add_argument("--max-wait-ms", type=float, default=0.0, help="how long a request that finds the model idle "
                   "waits for others before its batch starts (default 0: at once; later ones join it mid-decode)")
    p.add_argument("--max-queue", type=int, default=64, help="requests that may wait; more are answered 503")
    p.add_argument("--max-hold-ms", type=float, default=1000.0, help="once a request with other options has "
                   "waited this long, the running batch takes no new rows, so that request runs next")
    p.add_argument("--max-model-len", type=int, default=None, help="longest prompt + max_tokens (default: the "
                   "model's max_position_embeddings)")
    p.add_argument("--chat-template", default=None, help="a Jinja chat template file, for a model without one")
    p.add_argument("--compile", action="store_true", help="a static cache of --max-model-len slots for "
                   "--max-batch-size rows, and torch.compile (one graph per decode shape; the first request of each "
                   "shape compiles); requests join the running batch into its free rows. Every call attends over "
                   "all slots: a lower --max-model-len makes calls cheaper")
    p.add_argument("--api-key", default=None, help="the key every /v1/* request must send as `Authorization: "
                   f"Bearer KEY` (else 401; /health stays open); default: ${API_KEY_ENV}, else none")
    p.add_argument("--max-request-bytes", type=int, default=4 << 20, help="the largest request body; a larger one "
                   "is refused 413 without being read (default 4 MiB)")
    p.add_argument("--request-timeout-s", type=float, default=None, help="the longest a request may take from its "
                   "arrival: then its row is cancelled and it is answered with what it has, finish_reason "
                   "\"timeout\" (default: none; a request may set a shorter request_timeout_s of its own)")
    p.add_argument("--drain-s", type=float, default=30.0, help="on SIGTERM: refuse new requests (503, Retry-After), "
                   "finish those in flight, and exit 0 within this many seconds (default 30)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    return p


def check_flags(args: argparse.Namespace) -> list[str]:
    """Reject flags that cannot work (ValueError) and return the warnings for those that are risky."""
    if args.api_key is None:
        args.api_key = os.environ.get(API_KEY_ENV) or None
    elif not args.api_key:
        raise ValueError(f"--api-key is empty: give a key, or leave the flag (and ${API_KEY_ENV}) out to serve "
                         "without one.")
    if args.max_request_bytes < 1:
        raise ValueError(f"--max-request-bytes={args.max_request_bytes}: it must be >= 1.")
    if args.request_timeout_s is not None and args.request_timeout_s <= 0:
        raise ValueError(f"--request-timeout-s={args.request_timeout_s:g}: it must be > 0 (or left out).")
    if args.drain_s < 0:
        raise ValueError(f"--drain-s={args.drain_s:g}: it must be >= 0.")
    if args.api_key is None and not loopback(args.host):
        return [f"listening on {args.host}, beyond loopback, without an API key: anyone who can reach this port "
                f"can use the model. Set --api-key (or ${API_KEY_ENV})."]
    return []


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def prepare(args: argparse.Namespace):
    """The model, its tokenizer and the name clients use, with the server's defaults in its generation config."""
    from transformers import CompileConfig

    from ..loading import load_model, resolve

    device, dtype = resolve(args.device, args.dtype)
    model, tokenizer = load_model(args.model, dtype)
    model = model.to(device).eval()
    if args.chat_template:
        tokenizer.chat_template = Path(args.chat_template).read_text(encoding="utf-8")
    config = model.generation_config
    config.assistant_mode = args.assistant_mode or getattr(config, "assistant_mode", None) or "packed_ss"
    if args.speculative_width is not None:
        config.speculative_width = args.speculative_width
    if args.compile:  # a cache of --max-model-len slots per row, so that every request that fits can join it
        config.cache_implementation, config.compile_config = "static", CompileConfig()
        config.max_cache_len = args.max_model_len or getattr(model.config, "max_position_embeddings", None)
    return model, tokenizer, args.served_model_name or Path(args.model).name


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    import uvicorn

    from ...front import check_generate
    from .app import build_app
    from .batcher import Batcher
    from .drain import DrainingServer
    from .gate import ServerState

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        for warning in check_flags(args):
            print(f"hf-packed-ss serve: warning: {warning}", file=sys.stderr, flush=True)
        model, tokenizer, name = prepare(args)
        config = model.generation_config
        check_generate(model, torch.tensor([[0]]), max_new_tokens=1, streamer=[None],
                       pad_token_id=config.pad_token_id if config.pad_token_id is not None else 0)
        batcher = Batcher(model, tokenizer, args.max_batch_size, args.max_wait_ms / 1000, args.max_queue,
                          args.max_hold_ms / 1000)
    except (ValueError, OSError) as error:
        print(f"hf-packed-ss serve: {error}", file=sys.stderr)
        return 2
    context = args.max_model_len or getattr(model.config, "max_position_embeddings", None)
    state = ServerState()
    app = build_app(model, tokenizer, name, batcher, context, api_key=args.api_key,
                    max_request_bytes=args.max_request_bytes, request_timeout_s=args.request_timeout_s, state=state)
    print(f"serving {name} ({config.assistant_mode}) on http://{args.host}:{args.port}/v1"
          f"{' (API key required)' if args.api_key else ''}", flush=True)
    server = DrainingServer(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level),
                            state, batcher, args.drain_s)
    with contextlib.suppress(KeyboardInterrupt):  # SIGINT, re-raised once uvicorn has shut down (as uvicorn.run)
        server.run()
    print(f"hf-packed-ss serve: stopped after {batcher.batches} batches of {batcher.rows} requests", flush=True)
    if state.draining:  # everything is answered and closed: skip the interpreter's teardown (about a second with
        sys.stderr.flush()  # torch and transformers loaded), which --drain-s would otherwise have to leave room for
        logging.shutdown()
        os._exit(0)
    return 0
