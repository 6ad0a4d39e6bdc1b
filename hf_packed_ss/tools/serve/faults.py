"""Load with faults on a server, and what must hold after it: every completed answer equal to its solo decode,
every bad request refused with the right code, no row left decoding, the memory flat.

``python -m hf_packed_ss.tools.serve.faults --model tiny-nemotron-gsm8k --requests 200 --clients 16`` starts a
server on a free loopback port (`--url` uses a running one; `--pid` then names its process for the RSS), answers
each distinct request once alone (the solo decodes), then runs `--rounds` rounds of `--requests` requests from
`--clients` threads, each request one of:
- whole / streamed: a request read to its end; its text must equal its solo decode;
- dropped stream (`--dropped-streams`): a stream whose client closes the connection after its first event;
- malformed (`--malformed`): a body that is not JSON, not an object, or has fields of the wrong type: must be 400;
- timeout (`--timeouts`): half carry `request_timeout_s` (`--timeout-s`), answered 200 with a prefix of the solo
  decode (`finish_reason` "timeout") or all of it; half are whole requests whose client gives up after
  `--timeout-s` (a dropped whole request);
- unauthorised (`--unauthorised`, with `--api-key`): a wrong key: must be 401.
After each round it reads `/health` until `active_rows` and `waiting` are 0 (at most `--settle-s`) and the
server's RSS; at the end it sends one fresh request. It prints the figures and exits 0 when all hold: no answer
differs from its solo decode, every refusal has the right code, 0 rows left active, the RSS grew at most 10%
between the last two rounds, the fresh request is answered and equal to its solo decode."""

from __future__ import annotations

import argparse
import http.client
import json
import random
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from . import load

# bodies that must be refused 400 (what each breaks: syntax, type, encoding, range)
MALFORMED: list[tuple[str, bytes]] = [
    ("/v1/completions", b'{"prompt": "Question: 1 + 1?", '),
    ("/v1/completions", b"prompt=hello"),
    ("/v1/completions", b"[1, 2, 3]"),
    ("/v1/completions", b'{"prompt": "\xff\xfe"}'),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": NaN}'),
    ("/v1/completions", b"[" * 20000),
    ("/v1/completions", b""),
    ("/v1/completions", json.dumps({"prompt": 5}).encode()),
    ("/v1/completions", json.dumps({"prompt": "x", "max_tokens": "many"}).encode()),
    ("/v1/completions", json.dumps({"prompt": "\ud800"}).encode()),
    ("/v1/completions", json.dumps({"prompt": "x", "temperature": -1}).encode()),
    ("/v1/completions", json.dumps({"prompt": "x", "stop": [1]}).encode()),
    ("/v1/completions", json.dumps({"prompt": "x", "speculative_width": "wide"}).encode()),
    ("/v1/chat/completions", json.dumps({"messages": "hi"}).encode()),
    ("/v1/chat/completions", json.dumps({"messages": [{"role": "user"}]}).encode()),
]


@dataclass
class Outcome:
    kind: str
    status: int | None = None  # None: the client left before an answer
    text: str | None = None
    finish: str | None = None
    index: int = 0  # which distinct request


@dataclass
class Round:
    requests: int = 0
    answered: int = 0  # whole or streamed, read to the end (timeouts answered included)
    equal_to_solo: int = 0
    differ: list = field(default_factory=list)  # (index, finish_reason) of answers that are not their solo decode
    timed_out: int = 0  # answered with finish_reason "timeout" (a prefix of the solo decode)
    dropped_streams: int = 0
    abandoned: int = 0  # whole requests whose client gave up
    refused: int = 0  # malformed or unauthorised
    refused_right_code: int = 0
    unexpected: list = field(default_factory=list)  # (kind, status) that should not happen
    active_rows_after: int | None = None
    waiting_after: int | None = None
    settle_s: float = 0.0
    rss_mib: float | None = None
    seconds: float = 0.0


def connection(url: str, timeout: float) -> http.client.HTTPConnection:
    parts = urlsplit(url)
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)


def send(url: str, path: str, body: bytes, headers: dict, timeout: float = 300.0):
    """POST `body`; the connection and its response (status read, body not)."""
    c = connection(url, timeout)
    c.request("POST", path, body, {"Content-Type": "application/json", **headers})
    return c, c.getresponse()


def whole(url: str, body: dict, headers: dict, timeout: float = 300.0) -> tuple[int, dict]:
    c, reply = send(url, "/v1/completions", json.dumps(body).encode(), headers, timeout)
    try:
        return reply.status, json.loads(reply.read() or b"{}")
    finally:
        c.close()


def streamed(url: str, body: dict, headers: dict, drop_after: int | None = None) -> Outcome:
    """A streamed request read to `data: [DONE]`, or dropped (the socket shut) after `drop_after` events."""
    c, reply = send(url, "/v1/completions", json.dumps({**body, "stream": True}).encode(), headers)
    text, finish, events = [], None, 0
    try:
        if reply.status != 200:
            return Outcome("stream", reply.status)
        while True:
            line = reply.fp.readline()
            if not line:
                break
            if not line.startswith(b"data: "):
                continue
            if line.strip() == b"data: [DONE]":
                return Outcome("stream", 200, "".join(text), finish)
            event = json.loads(line[6:])
            if "error" in event:
                return Outcome("stream", event["error"]["code"])
            for choice in event.get("choices", []):
                text.append(choice.get("text") or "")
                finish = choice.get("finish_reason") or finish
            events += 1
            if drop_after is not None and events >= drop_after:
                c.sock.shutdown(socket.SHUT_RDWR)
                return Outcome("dropped")
        return Outcome("stream", None)  # the server closed the stream early
    finally:
        c.close()


def rss_mib(pid: int | None) -> float | None:
    if pid is None:
        return None
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return None


def distinct(n: int, max_tokens: int) -> list[dict]:
    """`n` different requests: GSM8K prompts, limits of 1/2, 3/4 and all of `max_tokens`, every fourth in AR mode
    (rows of another key, so batches of two kinds alternate)."""
    bodies = []
    for i, prompt in enumerate(load.prompts(n)):
        body = {"prompt": prompt, "max_tokens": max(1, max_tokens * (2 + i % 3) // 4)}
        if i % 4 == 3:
            body["assistant_mode"] = "ar"
        bodies.append(body)
    return bodies


def plan(args, rng: random.Random) -> list[tuple[str, int]]:
    """(kind, which distinct request) for every request of a round, shuffled."""
    n = args.requests
    counts = {"dropped": round(n * args.dropped_streams), "malformed": round(n * args.malformed),
              "timeout": round(n * args.timeouts / 2), "abandoned": round(n * args.timeouts / 2),
              "unauthorised": round(n * args.unauthorised) if args.api_key else 0}
    kinds = [k for k, c in counts.items() for _ in range(c)]
    if len(kinds) > n:
        raise SystemExit("the shares of faults add up to more than 1")
    rest = n - len(kinds)
    kinds += ["whole" if i % 2 == 0 else "stream" for i in range(rest)]
    rng.shuffle(kinds)
    return [(k, rng.randrange(args.distinct)) for k in kinds]


def one(url: str, args, kind: str, index: int, bodies: list[dict], headers: dict) -> Outcome:
    body = bodies[index]
    try:
        if kind == "whole":
            status, answer = whole(url, body, headers)
            if status != 200:
                return Outcome(kind, status, index=index)
            choice = answer["choices"][0]
            return Outcome(kind, 200, choice["text"], choice["finish_reason"], index)
        if kind == "stream":
            out = streamed(url, body, headers)
            out.index = index
            return out
        if kind == "dropped":
            return streamed(url, {**body, "max_tokens": args.long_tokens}, headers, drop_after=1)
        if kind == "timeout":
            status, answer = whole(url, {**body, "request_timeout_s": args.timeout_s}, headers)
            if status != 200:
                return Outcome(kind, status, index=index)
            choice = answer["choices"][0]
            return Outcome(kind, 200, choice["text"], choice["finish_reason"], index)
        if kind == "abandoned":
            try:
                status, answer = whole(url, body, headers, args.timeout_s)
            except TimeoutError:
                return Outcome(kind)
            choice = answer["choices"][0] if status == 200 else {}
            return Outcome("whole" if status == 200 else kind, status, choice.get("text"),
                           choice.get("finish_reason"), index)
        if kind == "malformed":
            path, raw = MALFORMED[index % len(MALFORMED)]
            c, reply = send(url, path, raw, headers)
            reply.read()
            c.close()
            return Outcome(kind, reply.status)
        if kind == "unauthorised":
            c, reply = send(url, "/v1/completions", json.dumps(body).encode(), {"Authorization": "Bearer wrong"})
            reply.read()
            c.close()
            return Outcome(kind, reply.status)
    except (OSError, http.client.HTTPException) as error:  # a connection the server broke: never expected
        return Outcome(kind, -1, repr(error), index=index)
    raise ValueError(kind)


def tally(outcomes: list[Outcome], solo: list[str]) -> Round:
    r = Round(requests=len(outcomes))
    right = {"malformed": 400, "unauthorised": 401}
    for o in outcomes:
        if o.kind in right:
            r.refused += 1
            r.refused_right_code += o.status == right[o.kind]
            if o.status != right[o.kind]:
                r.unexpected.append((o.kind, o.status))
        elif o.kind == "dropped":
            r.dropped_streams += 1
        elif o.kind == "abandoned" and o.status is None:
            r.abandoned += 1
        elif o.status != 200:
            r.unexpected.append((o.kind, o.status, o.text))
        else:
            r.answered += 1
            reference = solo[o.index]
            if o.finish == "timeout":
                r.timed_out += 1
                ok = reference.startswith(o.text)
            else:
                ok = o.text == reference
            r.equal_to_solo += ok
            if not ok:
                r.differ.append((o.index, o.finish))
    return r


def settle(url: str, headers: dict, seconds: float) -> tuple[int, int, float]:
    """/health's active_rows and waiting once both are 0 (or `seconds` have passed), and how long that took."""
    begin = time.monotonic()
    while True:
        health = load.get(url, "/health", headers)
        if (health["active_rows"] == 0 and health["waiting"] == 0) or time.monotonic() - begin > seconds:
            return health["active_rows"], health["waiting"], time.monotonic() - begin
        time.sleep(0.05)


def run_round(url: str, args, rng: random.Random, bodies: list[dict], solo: list[str], headers: dict,
              pid: int | None) -> Round:
    jobs = plan(args, rng)
    begin = time.monotonic()
    with ThreadPoolExecutor(args.clients) as pool:
        outcomes = list(pool.map(lambda job: one(url, args, job[0], job[1], bodies, headers), jobs))
    seconds = time.monotonic() - begin
    result = tally(outcomes, solo)
    result.seconds = seconds
    result.active_rows_after, result.waiting_after, result.settle_s = settle(url, headers, args.settle_s)
    result.rss_mib = rss_mib(pid)
    return result


def report(i: int, r: Round) -> str:
    rss = "?" if r.rss_mib is None else f"{r.rss_mib:.1f} MiB"
    return (f"round {i}: {r.requests} requests in {r.seconds:.1f} s: {r.answered} answered, {r.equal_to_solo} equal "
            f"to solo decode ({r.timed_out} of them cut at their timeout, a prefix of it), {len(r.differ)} differ; "
            f"{r.refused_right_code}/{r.refused} refused with the right code; {r.dropped_streams} dropped streams, "
            f"{r.abandoned} abandoned whole requests; {len(r.unexpected)} unexpected answers; rows left active "
            f"after: {r.active_rows_after} (waiting {r.waiting_after}, settled in {r.settle_s:.2f} s); "
            f"server RSS {rss}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-nemotron-gsm8k")
    p.add_argument("--url", default=None, help="a running server (default: start one)")
    p.add_argument("--pid", type=int, default=None, help="the running server's process id (for its RSS)")
    p.add_argument("--serve-args", default="", help="extra `hf-packed-ss serve` flags for the started server")
    p.add_argument("--api-key", default=None, help="the server's key (a started server gets it too)")
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--distinct", type=int, default=16, help="different requests the load cycles through")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--long-tokens", type=int, default=512, help="max_tokens of the streams that are dropped")
    p.add_argument("--dropped-streams", type=float, default=0.25)
    p.add_argument("--malformed", type=float, default=0.10)
    p.add_argument("--timeouts", type=float, default=0.10)
    p.add_argument("--timeout-s", type=float, default=0.2)
    p.add_argument("--unauthorised", type=float, default=0.05)
    p.add_argument("--settle-s", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the figures here")
    args = p.parse_args(argv)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    process, pid = None, args.pid
    if args.url is None:
        port = load.free_port()
        extra = args.serve_args.split() + (["--api-key", args.api_key] if args.api_key else [])
        process = load.start(args.model, port, extra)
        url, pid = f"http://127.0.0.1:{port}", process.pid
    else:
        url = args.url.rstrip("/")
    try:
        bodies = distinct(args.distinct, args.max_tokens)
        solo = []
        for body in bodies:  # one at a time: each request decoded alone
            status, answer = whole(url, body, headers)
            if status != 200:
                raise SystemExit(f"a solo request was answered {status}: {answer}")
            solo.append(answer["choices"][0]["text"])
        rss_before = rss_mib(pid)
        rng = random.Random(args.seed)
        rounds = [run_round(url, args, rng, bodies, solo, headers, pid) for _ in range(args.rounds)]
        status, answer = whole(url, bodies[0], headers)
        fresh = status == 200 and answer["choices"][0]["text"] == solo[0]
    finally:
        if process is not None:
            process.terminate()
            process.wait(30)
    print(f"server RSS before the load: {'?' if rss_before is None else f'{rss_before:.1f} MiB'}")
    for i, r in enumerate(rounds, 1):
        print(report(i, r))
    growth = None
    if len(rounds) >= 2 and rounds[-2].rss_mib and rounds[-1].rss_mib:
        growth = rounds[-1].rss_mib / rounds[-2].rss_mib - 1
        print(f"server RSS between the last two rounds: {100 * growth:+.1f}% (at most +10% holds)")
    print(f"a fresh request after the load: {'answered, equal to its solo decode' if fresh else 'FAILED'}")
    holds = (fresh and all(not r.differ and not r.unexpected and r.refused_right_code == r.refused
                           and r.active_rows_after == 0 for r in rounds) and (growth is None or growth <= 0.10))
    print(f"all hold: {holds}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rss_before_mib": rss_before,
                                               "rounds": [asdict(r) for r in rounds], "rss_growth": growth,
                                               "fresh": fresh, "holds": holds}, indent=2))
    return 0 if holds else 1


if __name__ == "__main__":
    sys.exit(main())
