"""`hf-packed-ss serve`: a real server in a subprocess on a free loopback port, driven with the `openai` client.

Every answer is compared with `generate` on the same model in float64 (so a batched row and a solo decode cannot
differ by a float tie): completions and chat, streamed and whole, `extra_body` options, stop strings, 32
concurrent requests from 8 threads; bad requests get 4xx with the reason; a disconnect frees its row; a full queue
answers 503; shutdown is clean."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import time
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


def test_compile_serves_through_the_static_cache_graph(tmp_path, model):
    """`--compile`: a static cache and torch.compile; the answers are still `generate`'s (eager, dynamic cache)."""
    port = load.free_port()
    process = load.start(MODEL, port, ["--dtype", "float64", "--threads", "1", "--compile"], tmp_path / "log.txt")
    try:
        for i in (4, 5):
            prompt = question(i)
            status, answer = load.post(f"http://127.0.0.1:{port}", "/v1/completions", {"prompt": prompt,
                                                                                      "max_tokens": 24})
            assert status == 200 and answer["choices"][0]["text"] == solo(model, model[1](prompt).input_ids,
                                                                          max_new_tokens=24)[0]
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
