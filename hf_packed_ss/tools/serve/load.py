"""Load on a running server, and the batching figure: aggregate throughput with `--clients` concurrent clients
against one client at a time, on the same requests.

``python -m hf_packed_ss.tools.serve.load --model tiny-nemotron-gsm8k`` starts a server on a free loopback port
(`--url` uses a running one instead), warms it up, then runs `--rounds` rounds, each decoding the same `--requests`
GSM8K prompts once one at a time and once from `--clients` threads (which first, alternating), and reports the
completion tokens per second of both, their ratio per round (median and range) and whether every answer equals its
one-at-a-time answer. The tests use `fire` for the same load without timing it."""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def post(url: str, path: str, body: dict | bytes, timeout: float = 300.0,
         headers: dict | None = None) -> tuple[int, dict]:
    """POST JSON (or raw bytes); the status and the decoded JSON answer, errors included."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json",
                                                                     **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def get(url: str, path: str, headers: dict | None = None) -> dict:
    with urllib.request.urlopen(urllib.request.Request(url + path, headers=headers or {}), timeout=10) as answer:
        return json.loads(answer.read())


def fire(url: str, bodies: list[dict], clients: int) -> list[tuple[int, dict]]:
    """Every body POSTed to /v1/completions from `clients` threads (each takes the next waiting body); the
    answers in the bodies' order."""
    with ThreadPoolExecutor(clients) as pool:
        return list(pool.map(lambda body: post(url, "/v1/completions", body), bodies))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(model: str, port: int, extra: list[str], log: Path | None = None, command: list[str] | None = None,
          env: dict | None = None) -> subprocess.Popen:
    """`hf-packed-ss serve` in a subprocess (`command`: what runs instead of ``python -m hf_packed_ss.tools.cli
    serve``; `env`: its environment); returns once /health answers (or raises with its output)."""
    out = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115 (the process keeps it)
    command = command or [sys.executable, "-m", "hf_packed_ss.tools.cli", "serve"]
    process = subprocess.Popen([*command, model, "--port", str(port), "--log-level", "warning", *extra],
                               stdout=out, stderr=subprocess.STDOUT, env=env)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited ({process.returncode}); see {log}")
        try:
            get(url, "/health")
            return process
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise RuntimeError("the server did not answer /health within 120 s")


def prompts(n: int) -> list[str]:
    from ..bench.suites import SAMPLE, gsm8k_prompt, read_jsonl

    rows = read_jsonl(SAMPLE)
    return [gsm8k_prompt(rows[i % len(rows)]["question"]) for i in range(n)]


def timed(url: str, bodies: list[dict], clients: int) -> tuple[float, list[tuple[int, dict]]]:
    begin = time.perf_counter()
    answers = fire(url, bodies, clients)
    return time.perf_counter() - begin, answers


def tokens(answers: list[tuple[int, dict]]) -> int:
    return sum(a["usage"]["completion_tokens"] for _, a in answers)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-nemotron-gsm8k")
    p.add_argument("--url", default=None, help="a running server (default: start one)")
    p.add_argument("--serve-args", default="", help="extra `hf-packed-ss serve` flags for the started server")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--json", default=None, help="write the rounds here")
    args = p.parse_args(argv)
    process = None
    if args.url is None:
        port = free_port()
        process = start(args.model, port, args.serve_args.split())
        url = f"http://127.0.0.1:{port}"
    else:
        url = args.url.rstrip("/")
    try:
        bodies = [{"prompt": text, "max_tokens": args.max_tokens} for text in prompts(args.requests)]
        timed(url, bodies[: args.clients], args.clients)  # warm-up: every code path once
        timed(url, bodies[:2], 1)
        rounds, same = [], True
        for r in range(args.rounds):
            order = [1, args.clients] if r % 2 == 0 else [args.clients, 1]
            result = {}
            for clients in order:
                seconds, answers = timed(url, bodies, clients)
                result[clients] = (tokens(answers) / seconds, answers)
            texts = {c: [a["choices"][0]["text"] for _, a in result[c][1]] for c in result}
            same = same and texts[1] == texts[args.clients]
            rounds.append({"one_client_tok_s": result[1][0], "concurrent_tok_s": result[args.clients][0],
                           "ratio": result[args.clients][0] / result[1][0]})
            print(f"round {r}: 1 client {result[1][0]:.1f} tok/s, {args.clients} clients "
                  f"{result[args.clients][0]:.1f} tok/s, ratio {rounds[-1]['ratio']:.2f}", flush=True)
        health = get(url, "/health")
    finally:
        if process is not None:
            process.terminate()
            process.wait(30)
    ratios = [r["ratio"] for r in rounds]
    print(f"{args.clients} concurrent clients vs one at a time: {statistics.median(ratios):.2f}x "
          f"(range {min(ratios):.2f}-{max(ratios):.2f} over {len(ratios)} rounds of {args.requests} requests); "
          f"answers equal one at a time: {same}; server: {health}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rounds": rounds, "same": same,
                                               "health": health}, indent=2))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
