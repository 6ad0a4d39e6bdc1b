"""`hf-packed-ss serve`: a real server in a subprocess on a free loopback port, driven with the `openai` client.

Every answer is compared with `generate` on the same model in float64 (so a batched row and a solo decode cannot
differ by a float tie): completions and chat, streamed and whole, `extra_body` options, stop strings, 32
concurrent requests from 8 threads; bad requests get 4xx with the reason; a disconnect frees its row; a full queue
answers 503; shutdown is clean. Then what a server in front of users needs (issue 38): the API key (401 before
parsing), size and context limits, request timeouts, dropped whole requests, malformed bodies, a failed batch, the
fault load of `faults.py`, and the SIGTERM drain."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest
import torch

openai = pytest.importorskip("openai")

from hf_packed_ss import bundled  # noqa: E402
from hf_packed_ss.tools.serve import load  # noqa: E402
from hf_packed_ss.tools.serve.protocol import Job, RequestError  # noqa: E402

MODEL = "tiny-nemotron-gsm8k"
TEMPLATE = "{% for m in messages %}{% if m.role == 'user' %}Question: {{ m.content }}\nAnswer:{% endif %}{% endfor %}"


@pytest.fixture(scope="module")
def model():
    return bundled.load(MODEL, torch.float64)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve")
    (folder / "chat.jinja").write_text(TEMPLATE)
    port = load.free_port()
    process = load.start(MODEL, port, ["--dtype", "float64", "--threads", "1", "--max-wait-ms", "20",
                                       "--chat-template", str(folder / "chat.jinja")], folder / "log.txt")
    yield f"http://127.0.0.1:{port}", process
    process.terminate()
    process.wait(30)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="none", max_retries=0, timeout=120)


def solo(model, ids: list[int], **options) -> tuple[str, object]:
    """What `generate` gives this prompt alone: the text (special tokens skipped) and its statistics."""
    net, tokenizer = model
    out = net.generate(torch.tensor([ids]), return_dict_in_generate=True, **options)
    return tokenizer.decode(out.sequences[0, len(ids):], skip_special_tokens=True), out.decoding_stats


def question(i: int) -> str:
    return load.prompts(i + 1)[i]


def test_models_and_health(client, server):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert load.get(server[0], "/health")["status"] == "ok"


@pytest.mark.parametrize("stream", [False, True])
def test_completion_equals_generate(client, model, stream):
    prompt = question(0)
    text, stats = solo(model, model[1](prompt).input_ids, max_new_tokens=48)
    if stream:
        chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=48, stream=True,
                                                stream_options={"include_usage": True}))
        got = "".join(c.choices[0].text for c in chunks if c.choices)
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
        assert chunks[-1].usage.completion_tokens == stats.new_tokens and not chunks[-1].choices
        assert len([c for c in chunks if c.choices and c.choices[0].text]) > 1  # streamed, not one piece
    else:
        answer = client.completions.create(model=MODEL, prompt=prompt, max_tokens=48)
        got = answer.choices[0].text
        assert answer.usage.prompt_tokens == len(model[1](prompt).input_ids)
        assert answer.usage.completion_tokens == stats.new_tokens
        assert answer.decoding_stats["nfe"] == stats.nfe and answer.decoding_stats["assistant_mode"] == "packed_ss"
    assert got == text and text


@pytest.mark.parametrize("stream", [False, True])
def test_chat_equals_generate_with_the_chat_template(client, model, stream):
    q = "Tom has 3 apples and buys 4 more. How many apples does he have?"
    text, _ = solo(model, model[1](f"Question: {q}\nAnswer:").input_ids, max_new_tokens=40)
    messages = [{"role": "user", "content": q}]
    if stream:
        chunks = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=40, stream=True)
        got = "".join(c.choices[0].delta.content or "" for c in chunks)
    else:
        answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=40)
        got = answer.choices[0].message.content
        assert answer.choices[0].message.role == "assistant" and answer.object == "chat.completion"
    assert got == text and text
    parts = [{"role": "user", "content": [{"type": "text", "text": q[:10]}, {"type": "text", "text": q[10:]}]}]
    assert client.chat.completions.create(model=MODEL, messages=parts, max_tokens=40).choices[0].message.content == text


@pytest.mark.parametrize("extra", [{"assistant_mode": "ar"}, {"assistant_mode": "linear_ss", "speculative_width": 3},
                                   {"assistant_mode": "quadratic_ss", "speculative_width": 2},
                                   {"speculative_width": 4}])
def test_extra_body_options_are_honoured(client, model, extra):
    prompt = question(1)
    text, stats = solo(model, model[1](prompt).input_ids, max_new_tokens=32, **extra)
    answer = client.completions.create(model=MODEL, prompt=prompt, max_tokens=32, extra_body=extra)
    assert answer.choices[0].text == text
    assert (answer.decoding_stats["assistant_mode"], answer.decoding_stats["speculative_width"],
            answer.decoding_stats["nfe"]) == (stats.schedule, stats.width, stats.nfe)


def test_stop_strings_cut_the_text_as_openai_does(client, model):
    prompt = question(2)
    full, _ = solo(model, model[1](prompt).input_ids, max_new_tokens=64)
    stop = full.split()[3]  # a word the answer reaches
    answer = client.completions.create(model=MODEL, prompt=prompt, max_tokens=64, stop=[stop])
    assert answer.choices[0].text == full[: full.index(stop)] and answer.choices[0].finish_reason == "stop"
    chunks = client.completions.create(model=MODEL, prompt=prompt, max_tokens=64, stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in chunks) == full[: full.index(stop)]


def test_seeded_sampling_equals_generate_with_that_seed(client, model):
    prompt = question(3)
    ids = model[1](prompt).input_ids
    text, _ = solo(model, ids, max_new_tokens=24, do_sample=True, temperature=0.8,
                   generator=torch.Generator().manual_seed(7))
    answer = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0.8, seed=7)
    assert answer.choices[0].text == text


@pytest.mark.parametrize("body,status,words", [
    ({"prompt": "x", "assistant_mode": "nope"}, 400, "Unknown assistant_mode"),
    ({"prompt": "x", "speculative_width": 99}, 400, "out of range"),
    ({"prompt": "x", "verify_order": "confidence"}, 400, "verify_order"),
    ({"prompt": "x " * 5000, "max_tokens": 16}, 400, "shorten the prompt"),
    ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens=0 is out of range"),
    ({"prompt": "x", "n": 2}, 400, "n=2 is not supported"),
    ({"prompt": "x", "temperature": "hot"}, 400, "temperature must be a number"),
    ({"prompt": "x", "colour": "red"}, 400, "Unknown request fields ['colour']"),
    ({"prompt": "x", "model": "gpt-4"}, 404, "is not served here"),
    ({"prompt": "x", "response_format": {"type": "json_object"}}, 400, "response_format"),
    (b'{"prompt": "x", ', 400, "not valid JSON"),
    (b'[1, 2]', 400, "must be a JSON object"),
])
def test_bad_requests_get_4xx_with_what_to_do(server, body, status, words):
    got, answer = load.post(server[0], "/v1/completions", body)
    assert got == status and words in answer["error"]["message"], answer


def test_bad_requests_through_the_openai_client(client):
    with pytest.raises(openai.BadRequestError, match="Unknown assistant_mode"):
        client.completions.create(model=MODEL, prompt="x", extra_body={"assistant_mode": "nope"})
    with pytest.raises(openai.BadRequestError, match="out of range"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                       extra_body={"speculative_width": 0})


def test_32_concurrent_requests_are_batched_and_each_equals_its_solo_decode(server, model):
    """8 client threads, 32 requests of different prompts, limits and modes: every answer is its own request's
    solo decode (none lost or swapped), rows shared batches, and the server is healthy afterwards."""
    url = server[0]
    before = load.get(url, "/health")
    modes = [{}, {}, {}, {"assistant_mode": "ar"}]
    bodies = [{"prompt": question(i % 16), "max_tokens": 16 + 8 * (i % 5), **modes[i % 4]} for i in range(32)]
    answers = load.fire(url, bodies, clients=8)
    for body, (status, answer) in zip(bodies, answers, strict=True):
        assert status == 200, answer
        options = {k: v for k, v in body.items() if k not in ("prompt", "max_tokens")}
        text, _ = solo(model, model[1](body["prompt"]).input_ids, max_new_tokens=body["max_tokens"], **options)
        assert answer["choices"][0]["text"] == text
    after = load.get(url, "/health")
    assert after["status"] == "ok" and after["failures"] == before["failures"]
    assert after["rows"] - before["rows"] == 32 and after["batches"] - before["batches"] < 32  # rows shared calls
    assert after["rows_joined"] > before["rows_joined"]  # some joined a running batch


def test_a_client_that_disconnects_frees_its_row(server):
    """A stream read for a few chunks and dropped: the server cancels the row (it stops long before its limit)."""
    import http.client

    url = server[0]
    before = load.get(url, "/health")
    port = int(url.rsplit(":", 1)[1])
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = {"prompt": "a a a a a a a a a a", "max_tokens": 3000, "stream": True, "assistant_mode": "ar"}
    connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    reply = connection.getresponse()
    assert reply.status == 200
    reply.fp.readline()  # the first event
    connection.sock.shutdown(socket.SHUT_RDWR)
    connection.close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        now = load.get(url, "/health")
        if now["rows_cancelled"] > before["rows_cancelled"]:
            break
        time.sleep(0.2)
    assert now["rows_cancelled"] == before["rows_cancelled"] + 1
    assert now["tokens_decoded"] - before["tokens_decoded"] < 3000  # it stopped, not ran to its limit
    status, _ = load.post(url, "/v1/completions", {"prompt": "Question: 1 + 1?\nAnswer:", "max_tokens": 4})
    assert status == 200


class Blocking:
    """A stand-in model whose `generate` waits until released (to fill the queue)."""

    def __init__(self):
        from transformers import GenerationConfig

        self.generation_config = GenerationConfig(eos_token_id=0, pad_token_id=0)
        self.device = torch.device("cpu")
        self.release = __import__("threading").Event()

    def generate(self, ids, **kwargs):
        self.release.wait(30)
        raise RuntimeError("released")


def test_a_full_queue_answers_503_and_a_failed_batch_answers_its_requests():
    from hf_packed_ss.tools.serve.batcher import Batcher, Ticket

    model = Blocking()
    batcher = Batcher(model, tokenizer=None, max_batch_size=1, max_wait_s=0.0, max_queue=2)
    loop = asyncio.new_event_loop()
    job = Job(chat=False, prompt_ids=[5], max_tokens=4, options={}, stop=[], stream=False, include_usage=False,
              seed=None)
    tickets = [Ticket(job, loop) for _ in range(3)]
    batcher.submit(tickets[0])
    time.sleep(0.3)  # the worker took it and is blocked in generate
    batcher.submit(tickets[1])
    batcher.submit(tickets[2])
    with pytest.raises(RequestError, match="at capacity") as refused:
        batcher.submit(Ticket(job, loop))
    assert refused.value.status == 503
    model.release.set()
    batcher.stop()
    loop.run_until_complete(asyncio.sleep(0.05))
    kinds = [t.events.get_nowait() for t in tickets]
    assert all(kind == "error" for kind, _ in kinds) and "released" in kinds[0][1].message
    assert batcher.failures >= 1
    loop.close()


def test_shutdown_is_clean(tmp_path):
    """Served from a local folder (not a bundled name); SIGINT ends it with exit code 0 and frees the port."""
    port = load.free_port()
    process = load.start(str(bundled.path(MODEL)), port, [], tmp_path / "log.txt")
    assert [m["id"] for m in load.get(f"http://127.0.0.1:{port}", "/v1/models")["data"]] == [MODEL]
    url = f"http://127.0.0.1:{port}"
    assert load.post(url, "/v1/completions", {"prompt": "Question: 2 + 2?\nAnswer:", "max_tokens": 4})[0] == 200
    process.send_signal(signal.SIGINT)
    assert process.wait(30) == 0
    assert "stopped after 1 batches of 1 requests" in (tmp_path / "log.txt").read_text()
    with pytest.raises(OSError):
        urllib.request.urlopen(url + "/health", timeout=2)


def test_it_listens_on_loopback_only_by_default(server):
    out = subprocess.run(["ss", "-ltnp"], capture_output=True, text=True).stdout if _has("ss") else ""
    port = server[0].rsplit(":", 1)[1]
    lines = [line for line in out.splitlines() if f":{port} " in line]
    if lines:  # `ss` may be missing; the default host is checked below either way
        assert all("127.0.0.1:" in line for line in lines)
    from hf_packed_ss.tools.serve import parser

    assert parser().parse_args([MODEL]).host == "127.0.0.1"


def _has(command: str) -> bool:
    import shutil

    return shutil.which(command) is not None


def test_compile_serves_through_the_static_cache_graph_and_rows_join_it(tmp_path, model):
    """`--compile`: a static cache of --max-batch-size rows and torch.compile. Requests that arrive while a batch
    runs join it into the rows that finished (more requests than rows: some wait for one); every answer is still
    its solo `generate` decode (eager, dynamic cache)."""
    port = load.free_port()
    process = load.start(MODEL, port, ["--dtype", "float64", "--threads", "1", "--compile", "--max-batch-size", "2",
                                       "--max-model-len", "512"], tmp_path / "log.txt")
    try:
        url = f"http://127.0.0.1:{port}"
        bodies = [{"prompt": question(i), "max_tokens": 12 + 6 * (i % 3)} for i in range(4, 10)]
        answers = load.fire(url, bodies, clients=3)
        for body, (status, answer) in zip(bodies, answers, strict=True):
            assert status == 200, answer
            ids = model[1](body["prompt"]).input_ids
            assert answer["choices"][0]["text"] == solo(model, ids, max_new_tokens=body["max_tokens"])[0]
        health = load.get(url, "/health")
        assert health["rows_joined"] > 0 and health["failures"] == 0 and health["active_rows"] == 0
    finally:
        process.terminate()
        process.wait(30)


def test_transformers_serve_decodes_with_our_classes_and_continuous_batching_is_refused(monkeypatch):
    """After `import hf_packed_ss` our classes resolve as `getattr(transformers, config.architectures[0])`, so
    transformers' own `Serve` loads a bundled folder and answers one request at a time with the decoder the
    model's generation config names (Packed-SS); its continuous batching, which would bypass it, is refused."""
    import transformers
    from transformers.cli.serve import Serve

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = str(bundled.path(MODEL))
    net, tokenizer = bundled.load(MODEL, torch.float32)
    assert getattr(transformers, net.config.architectures[0]) is type(net)
    with pytest.raises(NotImplementedError, match="hf-packed-ss serve"):
        net.init_continuous_batching()
    port = load.free_port()
    server = Serve(force_model=path, port=port, host="127.0.0.1", device="cpu", dtype="float32", non_blocking=True)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                status, answer = load.post(url, "/v1/completions", {"model": path, "prompt": question(6),
                                                                     "max_tokens": 24})
                break
            except OSError:
                time.sleep(0.1)
        ids = tokenizer(question(6)).input_ids
        assert status == 200 and answer["choices"][0]["text"] == solo((net, tokenizer), ids, max_new_tokens=24)[0]
    finally:
        server.kill_server()


# ---------------------------------------------------------------------------------------------------------------
# Serving that holds (issue 38): keys, limits, faults, drain. A second server, of the random tiny checkpoint (its
# rows run to their limit, so a row is still decoding when a client leaves or a deadline passes), started with its
# key in HF_PACKED_SS_API_KEY and a stand-in fault: a batch holding the prompt FAULT fails.

KEY = "sk-test-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
RANDOM = "tiny-nemotron-random"
LONG = {"prompt": "a a a a", "max_tokens": 4000}  # longer than any bound below (seconds of decoding)
FAULT = [1001] * 4  # a prompt no other test sends
FAULTY = f"""
import sys
from hf_packed_ss.tools import serve

real = serve.prepare


def prepare(args):
    model, tokenizer, name = real(args)
    generate = model.generate

    def failing(ids, **options):
        if (ids[:, -{len(FAULT)}:] == {FAULT[0]}).all(dim=1).any():
            raise RuntimeError("injected fault")
        return generate(ids, **options)

    model.generate = failing
    return model, tokenizer, name


serve.prepare = prepare
sys.exit(serve.main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def random_model():
    return bundled.load(RANDOM, torch.float64)


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    """(url, process): key from the environment, a 64 KiB body limit, a 1.5 s request timeout, faults injectable."""
    import os
    import sys

    folder = tmp_path_factory.mktemp("guarded")
    (folder / "faulty.py").write_text(FAULTY)
    port = load.free_port()
    env = {**os.environ, "HF_PACKED_SS_API_KEY": KEY}
    process = load.start(RANDOM, port, ["--dtype", "float64", "--threads", "1", "--max-wait-ms", "20",
                                        "--max-request-bytes", "65536", "--request-timeout-s", "1.5"],
                         folder / "log.txt", command=[sys.executable, str(folder / "faulty.py")], env=env)
    yield f"http://127.0.0.1:{port}", process
    process.terminate()
    process.wait(30)


def health(url: str) -> tuple[int, dict]:
    """/health's status and body, 503 included."""
    try:
        with urllib.request.urlopen(url + "/health", timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def settled(url: str, seconds: float = 5.0) -> dict:
    """/health once no row decodes and none waits (or after `seconds`)."""
    deadline = time.monotonic() + seconds
    while True:
        now = health(url)[1]
        if (now["active_rows"] == 0 and now["waiting"] == 0) or time.monotonic() > deadline:
            return now
        time.sleep(0.02)


def raw(url: str, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    import http.client

    port = int(url.rsplit(":", 1)[1])
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request(method, path, body, {"Content-Type": "application/json", **(headers or {})})
    reply = connection.getresponse()
    data = reply.read()
    connection.close()
    return reply.status, dict(reply.getheaders()), json.loads(data) if data else {}


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"},
                                     {"Authorization": f"Bearer {KEY}x"}, {"Authorization": KEY}])
@pytest.mark.parametrize("method,path", [("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
                                         ("GET", "/v1/models")])
def test_a_request_without_the_key_is_refused_401_before_it_is_parsed(guarded, headers, method, path):
    before = health(guarded[0])[1]
    body = b'{"prompt": "not even JSON' if method == "POST" else None  # 401, not the 400 parsing would give
    status, got_headers, answer = raw(guarded[0], method, path, body, headers)
    assert status == 401, answer
    assert answer["error"]["type"] == "invalid_request_error" and answer["error"]["code"] == "invalid_api_key"
    assert "Authorization: Bearer" in answer["error"]["message"] and got_headers.get("www-authenticate") == "Bearer"
    assert health(guarded[0])[1]["rows"] == before["rows"]  # nothing reached the batcher


def test_the_key_opens_every_endpoint_and_health_stays_open(guarded, random_model):
    url = guarded[0]
    code, now = health(url)
    assert code == 200 and now["status"] == "ok" and {"active_rows", "waiting"} <= set(now)
    assert [m["id"] for m in load.get(url, "/v1/models", AUTH)["data"]] == [RANDOM]
    assert raw(url, "POST", "/v1/completions", b'{"prompt": "x", ', AUTH)[0] == 400  # with the key: parsed
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=60)
    prompt = "b c d"
    text, _ = solo(random_model, random_model[1](prompt).input_ids, max_new_tokens=24)
    assert client.completions.create(model=RANDOM, prompt=prompt, max_tokens=24).choices[0].text == text
    with pytest.raises(openai.AuthenticationError, match="Incorrect API key"):
        openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).models.list()


def test_the_key_is_compared_in_constant_time(monkeypatch):
    import hmac

    from hf_packed_ss.tools.serve import gate

    seen, compare = [], hmac.compare_digest

    def spy(a, b):
        seen.append((a, b))
        return compare(a, b)

    monkeypatch.setattr(gate.hmac, "compare_digest", spy)
    key = KEY.encode()
    assert gate.authorised([(b"authorization", b"Bearer " + key)], key) is True
    assert gate.authorised([(b"authorization", b"bearer " + key)], key) is True  # the scheme is case-insensitive
    assert gate.authorised([(b"authorization", b"Bearer nope")], key) is False
    assert gate.authorised([(b"authorization", b"Basic " + key)], key) is False
    assert gate.authorised([], key) is None
    assert seen == [(key, key), (key, key), (b"nope", key), (key, key)]  # every key present went through it


def test_flags_the_key_from_the_environment_and_the_loopback_warning(monkeypatch):
    from hf_packed_ss.tools.serve import check_flags, loopback, parser

    monkeypatch.setenv("HF_PACKED_SS_API_KEY", "from-env")
    args = parser().parse_args([MODEL])
    assert check_flags(args) == [] and args.api_key == "from-env"
    args = parser().parse_args([MODEL, "--api-key", "from-flag", "--host", "0.0.0.0"])
    assert check_flags(args) == [] and args.api_key == "from-flag"  # the flag wins; with a key, no warning
    monkeypatch.delenv("HF_PACKED_SS_API_KEY")
    assert "without an API key" in check_flags(parser().parse_args([MODEL, "--host", "0.0.0.0"]))[0]
    assert check_flags(parser().parse_args([MODEL, "--host", "::1"])) == []
    assert [loopback(h) for h in ("127.0.0.1", "127.0.0.2", "localhost", "::1", "0.0.0.0", "10.0.0.1", "::",
                                  "example.com")] == [True, True, True, True, False, False, False, False]
    for bad in (["--api-key", ""], ["--max-request-bytes", "0"], ["--request-timeout-s", "0"], ["--drain-s", "-1"]):
        with pytest.raises(ValueError):
            check_flags(parser().parse_args([MODEL, *bad]))


def test_listening_beyond_loopback_without_a_key_warns_at_start(tmp_path):
    """The warning comes before the model loads (here a folder that does not exist, so nothing binds); with a key
    there is none (`check_flags`, above)."""
    import sys

    command = [sys.executable, "-m", "hf_packed_ss.tools.cli", "serve", str(tmp_path / "none")]
    out = subprocess.run([*command, "--host", "0.0.0.0"], capture_output=True, text=True, env=_no_key_env())
    assert out.returncode != 0 and "warning: listening on 0.0.0.0, beyond loopback, without an API key" in out.stderr


def _no_key_env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if k != "HF_PACKED_SS_API_KEY"}


def test_a_body_over_the_limit_is_refused_413_without_being_read(guarded):
    """A declared Content-Length of 1 GiB with 20 bytes sent: answered at once; a chunked body is read only until
    it passes the limit; an 8 MiB body sent whole before the answer is read gets the 413 too; the server goes on
    serving."""
    import http.client

    port = int(guarded[0].rsplit(":", 1)[1])
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    connection.putrequest("POST", "/v1/completions")
    for name, value in {**AUTH, "Content-Type": "application/json", "Content-Length": str(1 << 30)}.items():
        connection.putheader(name, value)
    connection.endheaders()
    connection.send(b'{"prompt": "a a a a ')
    begin = time.monotonic()
    reply = connection.getresponse()
    answer = json.loads(reply.read())
    assert reply.status == 413 and "over this server's limit of 65536 bytes" in answer["error"]["message"]
    assert time.monotonic() - begin < 5
    connection.close()

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    connection.putrequest("POST", "/v1/completions")
    for name, value in {**AUTH, "Content-Type": "application/json", "Transfer-Encoding": "chunked"}.items():
        connection.putheader(name, value)
    connection.endheaders()
    chunk = b"a" * 16384
    sent = 0
    with contextlib.suppress(OSError):  # the server may close before all is sent: that is the point
        for _ in range(64):  # 1 MiB offered, 64 KiB allowed
            connection.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            sent += len(chunk)
    reply = connection.getresponse()
    assert reply.status == 413
    connection.close()
    # a client that sends all of a large body before it reads (urllib) still reads the 413, not a reset
    status, answer = load.post(guarded[0], "/v1/completions", {"prompt": "a " * (4 << 20)}, headers=AUTH)
    assert status == 413 and answer["error"]["code"] == 413
    assert load.post(guarded[0], "/v1/completions", {"prompt": "b c", "max_tokens": 4}, headers=AUTH)[0] == 200


def test_a_prompt_longer_than_the_context_is_refused_400_with_the_lengths(guarded, random_model):
    prompt = "x " * 5000
    n = len(random_model[1](prompt).input_ids)
    status, answer = load.post(guarded[0], "/v1/completions", {"prompt": prompt}, headers=AUTH)
    assert status == 400 and f"The prompt has {n} tokens and the model's context is 4096" in answer["error"]["message"]
    status, answer = load.post(guarded[0], "/v1/completions", {"prompt": "x " * 100, "max_tokens": 4090},
                               headers=AUTH)
    assert status == 400 and "The prompt has 101 tokens; with max_tokens=4090" in answer["error"]["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_timeout_cancels_the_row_and_answers_with_what_it_has(guarded, random_model, stream):
    """`request_timeout_s` 0.5 s (the request's own) and --request-timeout-s 1.5 s (the server's): the row is cut
    there, answered with its tokens so far (the solo decode's first ones) and finish_reason "timeout"."""
    url = guarded[0]
    before = health(url)[1]
    for own, bound in ((0.5, 0.5), (None, 1.5)):
        body = {**LONG} if own is None else {**LONG, "request_timeout_s": own}
        begin = time.monotonic()
        client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=60)
        if stream:
            chunks = list(client.completions.create(model=RANDOM, stream=True, stream_options={"include_usage": True},
                                                    extra_body=({} if own is None else {"request_timeout_s": own}),
                                                    prompt=LONG["prompt"], max_tokens=LONG["max_tokens"]))
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
            tokens = chunks[-1].usage.completion_tokens
        else:
            status, answer = load.post(url, "/v1/completions", body, headers=AUTH)
            assert status == 200, answer
            text, finish = answer["choices"][0]["text"], answer["choices"][0]["finish_reason"]
            tokens = answer["usage"]["completion_tokens"]
        took = time.monotonic() - begin
        assert finish == "timeout" and 0 < tokens < LONG["max_tokens"]
        assert bound - 0.05 < took < bound + 2.0
        ids = random_model[1](LONG["prompt"]).input_ids
        assert text == solo(random_model, ids, max_new_tokens=tokens)[0]
    now = settled(url)
    assert now["active_rows"] == 0 and now["rows_timed_out"] == before["rows_timed_out"] + 2


def test_a_whole_request_whose_client_leaves_frees_its_row_at_once(guarded):
    """No stream: the client gives up after 0.5 s; the row leaves the batch within one round, not at its end."""
    import http.client

    url = guarded[0]
    before = health(url)[1]
    port = int(url.rsplit(":", 1)[1])
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=0.5)
    connection.request("POST", "/v1/completions", json.dumps(LONG), {"Content-Type": "application/json", **AUTH})
    time.sleep(0.3)
    assert health(url)[1]["active_rows"] == 1  # decoding
    with pytest.raises(TimeoutError):
        connection.getresponse()
    connection.close()
    left = time.monotonic()
    now = settled(url, 5.0)
    assert now["active_rows"] == 0 and time.monotonic() - left < 1.0
    assert now["rows_cancelled"] == before["rows_cancelled"] + 1
    assert now["tokens_decoded"] - before["tokens_decoded"] < LONG["max_tokens"] // 2


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", b'{"prompt": "x", "max_tokens": NaN}'),
    ("/v1/completions", b'{"prompt": "x", "temperature": Infinity}'),
    ("/v1/completions", b"[" * 50000),  # deeper than Python's json can nest
    ("/v1/completions", b'{"prompt": "\xff\xfe"}'),
    ("/v1/completions", b""),
    ("/v1/completions", json.dumps({"prompt": "\ud800 lone surrogate"}).encode()),
    ("/v1/completions", json.dumps({"prompt": "x", "seed": 2**70}).encode()),
    ("/v1/completions", json.dumps({"prompt": "x", "speculative_width": "4"}).encode()),
    ("/v1/completions", json.dumps({"prompt": "x", "assistant_mode": 5}).encode()),
    ("/v1/completions", json.dumps({"prompt": "x", "request_timeout_s": 0}).encode()),
    ("/v1/completions", json.dumps({"prompt": "x", "request_timeout_s": "soon"}).encode()),
    ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": 5}]}).encode()),
])
def test_malformed_requests_are_400_never_500(guarded, path, body):
    status, _, answer = raw(guarded[0], "POST", path, body, AUTH)
    assert status == 400 and answer["error"]["type"] == "invalid_request_error", answer


def test_a_failed_batch_answers_its_requests_500_and_the_server_keeps_serving(guarded, random_model):
    url = guarded[0]
    before = health(url)[1]
    status, answer = load.post(url, "/v1/completions", {"prompt": FAULT, "max_tokens": 8}, headers=AUTH)
    assert status == 500 and "injected fault" in answer["error"]["message"]
    assert answer["error"]["type"] == "server_error"
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=60)
    with pytest.raises(openai.APIError, match="injected fault"):
        list(client.completions.create(model=RANDOM, prompt=FAULT, max_tokens=8, stream=True))
    prompt = "e f g"
    text, _ = solo(random_model, random_model[1](prompt).input_ids, max_new_tokens=16)
    status, answer = load.post(url, "/v1/completions", {"prompt": prompt, "max_tokens": 16}, headers=AUTH)
    assert status == 200 and answer["choices"][0]["text"] == text
    now = settled(url)
    assert now["status"] == "ok" and now["failures"] == before["failures"] + 2 and now["active_rows"] == 0


def test_the_fault_load_leaves_no_row_active_and_every_answer_equal_to_its_solo_decode(guarded, capsys):
    """tools/serve/faults.py, small: 40 requests from 8 clients, with a quarter of the streams dropped, a tenth
    malformed, timeouts and wrong keys; it exits 0 only when everything it checks holds."""
    from hf_packed_ss.tools.serve import faults

    code = faults.main(["--url", guarded[0], "--pid", str(guarded[1].pid), "--api-key", KEY, "--requests", "40",
                        "--clients", "8", "--distinct", "8", "--max-tokens", "16", "--long-tokens", "2000"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "rows left active after: 0" in out and "all hold: True" in out


def _start_plain(tmp_path, extra: list[str]):
    port = load.free_port()
    process = load.start(RANDOM, port, ["--threads", "1", *extra], tmp_path / "log.txt", env=_no_key_env())
    return f"http://127.0.0.1:{port}", process


def _stream_lines(url: str, body: dict):
    """A streamed request's connection and its open response (to read event by event)."""
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", int(url.rsplit(":", 1)[1]), timeout=60)
    connection.request("POST", "/v1/completions", json.dumps({**body, "stream": True}),
                       {"Content-Type": "application/json"})
    reply = connection.getresponse()
    assert reply.status == 200
    return connection, reply


def _read_stream(reply) -> tuple[str, str | None]:
    """The text and finish_reason of a stream read to `data: [DONE]` (raw lines: one chunk holds whole events)."""
    text, finish = [], None
    for line in iter(reply.fp.readline, b""):
        if line.strip() == b"data: [DONE]":
            break
        if line.startswith(b"data: "):
            for choice in json.loads(line[6:]).get("choices", []):
                text.append(choice["text"])
                finish = choice["finish_reason"] or finish
    return "".join(text), finish


def test_sigterm_drains_refuses_new_requests_finishes_rows_in_flight_and_exits_0(tmp_path, random_model):
    """SIGTERM while a stream decodes: new requests get 503 with Retry-After, /health says draining, the stream
    ends whole (equal to its solo decode), and the process exits 0."""
    url, process = _start_plain(tmp_path, ["--drain-s", "30", "--dtype", "float64"])
    try:
        body = {"prompt": "h i j", "max_tokens": 800}
        connection, reply = _stream_lines(url, body)
        reply.fp.readline()
        process.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        status, headers, answer = raw(url, "POST", "/v1/completions", json.dumps({"prompt": "x"}).encode())
        assert status == 503 and int(headers["retry-after"]) >= 1 and "shutting down" in answer["error"]["message"]
        code, now = health(url)
        assert code == 503 and now["status"] == "draining" and now["active_rows"] == 1
        text, finish = _read_stream(reply)
        connection.close()
        assert process.wait(30) == 0
    finally:
        process.kill()
    ids = random_model[1](body["prompt"]).input_ids
    assert finish == "length" and text == solo(random_model, ids, max_new_tokens=body["max_tokens"])[0]
    log = (tmp_path / "log.txt").read_text()
    assert "draining (1 requests in flight" in log and "stopped after 1 batches of 1 requests" in log


def test_sigterm_exits_within_drain_s_cutting_rows_still_decoding(tmp_path):
    """--drain-s 2 and a row of 4000 tokens: at the bound it ends with what it has (finish_reason "timeout") and
    the process has exited 0 within the bound."""
    url, process = _start_plain(tmp_path, ["--drain-s", "2"])
    try:
        connection, reply = _stream_lines(url, LONG)
        reply.fp.readline()
        begin = time.monotonic()
        process.send_signal(signal.SIGTERM)
        text, finish = _read_stream(reply)
        connection.close()
        assert process.wait(30) == 0
        took = time.monotonic() - begin
    finally:
        process.kill()
    assert finish == "timeout" and text
    assert took < 2.0 + 0.5, took  # the bound, and a little for a slow machine
