"""`hf-packed-ss train`: each objective's training step lowers its loss on a tiny fixed batch, the
drafter objective never changes the verifier rows, and a run resumes where it stopped."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_packed_ss import bundled
from hf_packed_ss.models.lora import proposal_only_adapters
from hf_packed_ss.tools.train import LOSSES, DrafterExample, TrainConfig, build_model, corpus, sample_batch

TINY = dict(hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64, block_size=8, seq_len=48, batch=4)


def _steps(model, loss_fn, batch, cfg, params, n=8, lr=3e-3):
    opt = torch.optim.AdamW(params, lr=lr)
    losses = []
    for i in range(n):
        gen = torch.Generator().manual_seed(i % 2)  # the same noise draws again and again
        loss, _ = loss_fn(model, batch, cfg, gen)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("distill", [0.0, 0.5])
@pytest.mark.parametrize("fmt", ["nemotron", "setdlm"])
def test_a_training_step_lowers_the_loss(fmt, distill):
    _, tokenizer = bundled.load("tiny-nemotron-random")
    cfg = TrainConfig(format=fmt, distill=distill, **TINY)
    torch.manual_seed(0)
    model = build_model(cfg, tokenizer)
    stream = corpus(tokenizer, ["Question: 2 + 3?\nAnswer: 5", "Question: 7 - 4?\nAnswer: 3"] * 8)
    batch = sample_batch(stream, cfg, torch.Generator().manual_seed(0))
    losses = _steps(model, LOSSES[fmt], batch, cfg, list(model.parameters()))
    assert losses[-1] < losses[0] - 0.5


@pytest.mark.parametrize("hard_targets", [0.0, 1.0])
def test_drafter_step_lowers_its_loss_and_never_touches_the_verifier(hard_targets):
    from peft import LoraConfig, get_peft_model

    from hf_packed_ss.models.smollm2 import MaskEmbedding, attach_drafter

    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128))
    ids = torch.randint(20, 64, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = base(ids).logits
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=4, target_modules=["q_proj", "v_proj", "down_proj"],
                                            init_lora_weights=False))
    embedding = MaskEmbedding(32)
    attach_drafter(model, block_size=4, mask_embedding=embedding)
    cfg = TrainConfig(format="drafter", block_size=4, blocks=6, hard_targets=hard_targets)
    params = [p for p in model.parameters() if p.requires_grad] + [embedding.delta]
    with proposal_only_adapters(model.get_base_model()):
        losses = _steps(model, LOSSES["drafter"], DrafterExample(ids, 10, 0, []), cfg, params, n=20, lr=1e-2)
        mixed, parts = LOSSES["drafter"](model, DrafterExample(ids, 10, 0, []), TrainConfig(
            format="drafter", block_size=4, blocks=6, hard_targets=0.25), torch.Generator().manual_seed(0))
        with torch.no_grad():
            after = model(ids).logits  # outside proposal rows: no adapter, no MASK offset
    # the KL falls 20%; a random base's argmax targets are near arbitrary labels, which a rank-4 adapter fits slowly
    assert losses[-1] < (losses[0] * 0.8 if not hard_targets else losses[0] - 0.2)
    assert torch.equal(before, after) and embedding.delta.abs().sum() > 0
    assert parts["ce"] != parts["kl"] and mixed.item() == pytest.approx(0.75 * parts["kl"] + 0.25 * parts["ce"])


def test_drafter_loss_equals_one_packed_forward_of_sequence_and_blocks():
    """The split step (the verifier over the sequence without gradients, over a cached shared head, then the
    blocks over that cache) gives the loss and the gradient of one packed forward of the sequence and the blocks
    (the sequence rows do not depend on the adapter), in float64."""
    import torch.nn.functional as F
    from peft import LoraConfig, get_peft_model

    from hf_packed_ss.models.lora import proposal_rows
    from hf_packed_ss.models.smollm2 import MaskEmbedding, attach_drafter
    from hf_packed_ss.tools.train import drafter_examples

    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                                        )).double()
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=4, target_modules=["q_proj", "v_proj", "down_proj"],
                                            init_lora_weights=False)).double()
    attach_drafter(model, block_size=4, mask_embedding=MaskEmbedding(32).double())
    cfg = TrainConfig(format="drafter", block_size=4, blocks=5)

    class Tokens:  # answers as ids already
        eos_token_id = 2

        def __call__(self, text, add_special_tokens=False):
            return type("Encoded", (), {"input_ids": [int(t) for t in text.split()]})

    prompts = [[7, 8, 9, 10, 11, 12], [7, 8, 9, 10, 13]]  # a shared head of 4 tokens
    answers = [" ".join(str(t) for t in torch.randint(20, 64, (n,)).tolist()) for n in (30, 25)]
    params = [p for p in model.parameters() if p.requires_grad]
    with proposal_only_adapters(model.get_base_model()):
        with torch.no_grad():  # the head's cache: the base's (no proposal rows, no adapter)
            example = drafter_examples(base, Tokens(), [(prompts, answers)], 64, 4)[0]
        assert example.head_length == 4
        split, _ = LOSSES["drafter"](model, example, cfg, torch.Generator().manual_seed(3))
        split_grads = torch.autograd.grad(split, params)
        # the one packed forward: the sequence (causal, adapter off) then the blocks (adapter on)
        gen = torch.Generator().manual_seed(3)
        x, n, b, k = example.ids, example.ids.shape[1], 4, 5
        anchors = torch.randint(example.answer_start - 1, n - b + 1, (k,), generator=gen)
        pos, offsets = torch.arange(n), torch.arange(b)
        inner = model.get_base_model()
        block_ids = torch.full((k, b), inner.config.mask_token_id)
        block_ids[:, 0] = x[0, anchors]
        block_of = torch.arange(k).repeat_interleave(b)
        mask = torch.zeros(n + k * b, n + k * b, dtype=torch.bool)
        mask[:n, :n] = torch.ones(n, n, dtype=torch.bool).tril()
        mask[n:, :n] = pos[None] < anchors.repeat_interleave(b)[:, None]
        mask[n:, n:] = block_of[:, None] == block_of[None, :]
        keep = torch.cat([(anchors[:, None] + offsets[:-1]).reshape(-1),
                          n + (torch.arange(k)[:, None] * b + offsets[1:]).reshape(-1)])
        with proposal_rows(inner, n):
            logits = inner(input_ids=torch.cat([x[0], block_ids.reshape(-1)])[None],
                           position_ids=torch.cat([pos, (anchors[:, None] + offsets).reshape(-1)])[None],
                           attention_mask=mask[None, None], logits_to_keep=keep).logits[0]
        teacher, student = logits[: keep.numel() // 2].detach(), logits[keep.numel() // 2 :]
        packed = F.kl_div(student.log_softmax(-1), teacher.log_softmax(-1), log_target=True, reduction="batchmean")
        packed_grads = torch.autograd.grad(packed, params)
    assert split.item() > 0 and torch.allclose(split, packed, rtol=1e-10, atol=1e-12)
    for a, g in zip(split_grads, packed_grads, strict=True):
        assert torch.allclose(a, g, rtol=1e-8, atol=1e-12)


def test_resume_continues_the_same_run(tmp_path, monkeypatch):
    from hf_packed_ss.tools import train as train_module

    _, tokenizer = bundled.load("tiny-nemotron-random")
    monkeypatch.setattr(train_module, "train_tokenizer", lambda texts, vocab: tokenizer)
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps({"question": f"{i} + 1?", "answer": f"#### {i + 1}"}) for i in range(40)))
    fields = dict(format="nemotron", data=str(data), steps=4, save_every=2, warmup=1, **TINY)
    straight, _ = train_module.train(TrainConfig(out=str(tmp_path / "a"), **fields), log=lambda *_: None)
    # stop after 2 of 4 steps (warm-up 1: both runs use the same learning rates for steps 0 and 1), then resume
    train_module.train(TrainConfig(out=str(tmp_path / "b"), **{**fields, "steps": 2}), log=lambda *_: None)
    resumed, _ = train_module.train(TrainConfig(out=str(tmp_path / "b"), **fields), resume=True, log=lambda *_: None)
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), name
    assert (tmp_path / "b" / "model.safetensors").is_file() and (tmp_path / "b" / "generation_config.json").is_file()
    # the loss log and each command's arguments survive the resume (a fresh run in the same folder starts over)
    logged = [json.loads(line)["step"] for line in (tmp_path / "b" / "train_log.jsonl").read_text().splitlines()]
    assert logged == [2, 4]
    state = torch.load(tmp_path / "b" / "trainer_state.pt", weights_only=False)
    assert [stage["steps"] for stage in state["stages"]] == [2, 4]
    train_module.train(TrainConfig(out=str(tmp_path / "b"), **{**fields, "steps": 2}), log=lambda *_: None)
    assert [json.loads(line)["step"] for line in (tmp_path / "b" / "train_log.jsonl").read_text().splitlines()] == [2]
    # `until` stops a run part-way with the learning rate still scheduled over all its steps (a later stage resumes)
    train_module.train(TrainConfig(out=str(tmp_path / "c"), **fields), log=lambda *_: None, until=3)
    assert torch.load(tmp_path / "c" / "trainer_state.pt", weights_only=False)["step"] == 3
    resumed, _ = train_module.train(TrainConfig(out=str(tmp_path / "c"), **fields), resume=True, log=lambda *_: None)
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), name


def test_base_answers_are_the_base_models_own_greedy_answers_and_resume(tmp_path):
    """Batched (left-padded) answers equal each question's own stock greedy answer in the benchmark's
    prompt format; a second call with more questions only answers the new ones."""
    from transformers import AutoTokenizer

    from hf_packed_ss.tools.base_answers import generate_answers
    from hf_packed_ss.tools.bench.suites import question_ids

    tokenizer = AutoTokenizer.from_pretrained(bundled.path("smollm2-135m-drafter"))
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                         max_position_embeddings=2048)).to(torch.float64).eval()
    questions = ["What is 2 + 3?", "Tom has 12 apples and eats 5 of them. How many are left?", "Is 7 prime?"]
    out = tmp_path / "answers.jsonl"
    rows = generate_answers(model, tokenizer, questions[:2], out, max_new_tokens=6, log=lambda _: None)
    assert [r["question"] for r in rows] == questions[:2]
    for row in rows:
        ids = question_ids(tokenizer, row["question"])
        alone = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.eos_token_id)
        new = alone[0, ids.shape[1]:].tolist()
        new = new[: new.index(tokenizer.eos_token_id)] if tokenizer.eos_token_id in new else new
        assert row["answer"] == tokenizer.decode(new)
    seen = []
    rows = generate_answers(model, tokenizer, questions, out, max_new_tokens=6, log=seen.append)
    assert [r["question"] for r in rows] == questions and seen == ["base answers: 3/3"]


def test_train_data_defaults_to_the_gsm8k_folder_variable(tmp_path, monkeypatch, capsys):
    """`--data` defaults to train.jsonl in $HF_PACKED_SS_GSM8K (read when the command runs; `--help` shows it),
    and a missing file stops the run before anything is written."""
    from hf_packed_ss.tools import train as train_module

    monkeypatch.setenv("HF_PACKED_SS_GSM8K", str(tmp_path))
    with pytest.raises(SystemExit):
        train_module.main(["--help"])
    assert "HF_PACKED_SS_GSM8K" in capsys.readouterr().out
    assert TrainConfig().data == str(tmp_path / "train.jsonl")
    with pytest.raises(SystemExit, match="HF_PACKED_SS_GSM8K"):
        train_module.train(TrainConfig(out=str(tmp_path / "run"), **TINY), log=lambda *_: None)
    assert not (tmp_path / "run").exists()


def _capture(model):
    """Wrap `model.forward` to keep the last call's keyword arguments."""
    seen = {}
    forward = model.forward

    def spy(**kwargs):
        seen.update(kwargs)
        return forward(**kwargs)

    model.forward = spy
    return seen


def test_variable_blocks_cut_anchored_blocks_to_every_width():
    """With `variable_blocks` the noisy rows fall into contiguous bidirectional blocks of 1..block_size rows,
    not all of `block_size`; each sees the clean rows before its own start, and a block whose first token is kept
    is an anchored `[last, MASK x W]` block of its own length."""
    _, tokenizer = bundled.load("tiny-nemotron-random")
    cfg = TrainConfig(format="nemotron", variable_blocks=1.0, **TINY)
    model = build_model(cfg, tokenizer)
    x = torch.randint(5, 200, (cfg.batch, cfg.seq_len), generator=torch.Generator().manual_seed(0))
    seen = _capture(model)
    LOSSES["nemotron"](model, x, cfg, torch.Generator().manual_seed(3))
    n, mask = cfg.seq_len, seen["attention_mask"][:, 0]
    lengths = set()
    for b in range(cfg.batch):
        noisy, clean = mask[b, :n, :n], mask[b, :n, n:]
        i = 0
        while i < n:
            block = noisy[i].nonzero().flatten().tolist()
            assert block == list(range(i, i + len(block))) and len(block) <= cfg.block_size
            for j in block:  # one block: the same rows, and the clean prefix before its start
                assert noisy[j].nonzero().flatten().tolist() == block
                assert clean[j].nonzero().flatten().tolist() == list(range(i))
            lengths.add(len(block))
            i += len(block)
    assert len(lengths) > 3  # cut at many lengths, not the fixed partition


def test_render_writes_the_trained_format_and_augment_mixes_in_the_others():
    from hf_packed_ss.tools.bench.suites import gsm8k_prompt
    from hf_packed_ss.tools.train import FORMATS, render

    rows = [{"question": f"What is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"} for i in range(400)]
    plain = render(rows, 0.0, seed=0)
    assert plain == [f"{gsm8k_prompt(r['question'])} {r['answer']}" for r in rows]
    mixed = render(rows, 0.5, seed=0)
    assert mixed == render(rows, 0.5, seed=0)  # seeded
    others = [t for t in mixed if not t.startswith("Question: ")]
    assert 150 < len(others) < 250 and {t.split("What")[0] for t in others} == {"", "Q: ", "User: "}
    assert all(t.endswith(r["answer"]) for t, r in zip(mixed, rows, strict=True)) and len(FORMATS) == 4


def test_repeats_mark_the_answer_tokens_that_continue_a_loop():
    from hf_packed_ss.tools.train import repeats

    tokenizer = bundled.load("tiny-nemotron-random")[1]
    loop = {"question": "How many apples?", "answer": " He has 5 apples. He has 5 apples. He has 5 apples."}
    (ids, marked), = repeats(tokenizer, [loop], TrainConfig(seq_len=256))
    prompt = tokenizer("Question: How many apples?\nAnswer:").input_ids
    assert ids[: len(prompt)] == prompt and tokenizer.decode(ids[len(prompt):]) == loop["answer"]
    for t in range(5, len(ids)):  # exactly the tokens that complete a 6-gram seen before
        assert (t in marked) == any(ids[s - 5 : s + 1] == ids[t - 5 : t + 1] for s in range(5, t))
    assert marked and min(marked) > len(prompt)
    assert repeats(tokenizer, [{"question": "Q?", "answer": " 1 2 3 4 5 6 7 8"}], TrainConfig()) == []


@pytest.mark.parametrize("fmt", ["nemotron", "setdlm"])
def test_ar_logits_are_the_ar_modes_next_token_and_unlikelihood_lowers_a_loop(fmt):
    """`ar_logits` at position t is what greedy AR decoding picks there; a few unlikelihood steps lower the
    probability of the marked loop tokens."""
    from hf_packed_ss.tools.train import ar_logits, with_unlikelihood

    _, tokenizer = bundled.load("tiny-nemotron-random")
    cfg = TrainConfig(format=fmt, unlikelihood=1.0, **TINY)
    torch.manual_seed(0)
    model = build_model(cfg, tokenizer).to(torch.float64).eval()
    prompt = torch.randint(5, 200, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = model.generate(prompt, assistant_mode="ar", max_new_tokens=6, do_sample=False)
        greedy = ar_logits(model, out, cfg)[0, 12:].argmax(-1)
    assert greedy.tolist() == out[0, 12:].tolist()
    ids = out[0].tolist() * 2
    negatives = [(ids, list(range(len(ids) // 2 + 5, len(ids))))]

    def marked_p():
        with torch.no_grad():
            p = ar_logits(model, torch.tensor([ids]), cfg)[0].softmax(-1)
        return p[negatives[0][1], [ids[t] for t in negatives[0][1]]].mean().item()

    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(30):  # first teach the model the loop (cross-entropy on the marked tokens)
        logits = ar_logits(model, torch.tensor([ids]), cfg)[0, negatives[0][1]]
        loss = torch.nn.functional.cross_entropy(logits, torch.tensor([ids[t] for t in negatives[0][1]]))
        opt.zero_grad()
        loss.backward()
        opt.step()
    before = marked_p()
    nothing = with_unlikelihood(lambda m, x, c, g: (torch.zeros((), dtype=torch.float64), {}), negatives, cfg, 0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(10):
        loss, parts = nothing(model, None, cfg, torch.Generator().manual_seed(0))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert before > 0.2 and "unlikelihood" in parts and marked_p() < before * 0.5


def test_self_distillation_keeps_own_answers_that_end_and_do_not_loop(tmp_path):
    """Own answers replace the reference where they end with EOS and repeat no 6-gram more than 3 times; the
    looping ones come back as the unlikelihood loss's negatives; the answers file is made once (resumable)."""
    from hf_packed_ss.tools.train import self_distilled

    rows = [{"question": f"Q{i}?", "answer": f"ref {i}"} for i in range(5)]
    own = [{"question": "Q0?", "answer": " own 0", "ended_with_eos": True, "max_6gram_repeats": 1},
           {"question": "Q1?", "answer": " own 1", "ended_with_eos": False, "max_6gram_repeats": 1},
           {"question": "Q2?", "answer": " a a a a", "ended_with_eos": True, "max_6gram_repeats": 4}]
    (tmp_path / "self_answers.jsonl").write_text("\n".join(json.dumps(r) for r in own) + "\n")
    earlier = tmp_path / "earlier.jsonl"
    earlier.write_text(json.dumps({**own[2], "question": "Q9?"}) + "\n" + json.dumps(own[0]) + "\n")
    cfg = TrainConfig(out=str(tmp_path), init=str(bundled.path("tiny-nemotron-random")), self_distill=4,
                      negatives=str(earlier))
    out, loops = self_distilled(rows, cfg, log=lambda *_: None)
    assert loops[-1]["question"] == "Q9?" and "Q0?" not in [a["question"] for a in loops]
    answers = [r["answer"] for r in out]  # Q3's is the random model's own, made now; Q4 is past self_distill
    assert answers[:3] == [" own 0", "ref 1", "ref 2"] and answers[4] == "ref 4"
    assert [a["question"] for a in loops][:1] == ["Q2?"]
    answers = [json.loads(line) for line in (tmp_path / "self_answers.jsonl").read_text().splitlines()]
    assert len(answers) == 4 and answers[3]["question"] == "Q3?" and set(answers[3]) >= {"ended_with_eos"}
    with pytest.raises(SystemExit, match="--init"):
        self_distilled(rows, TrainConfig(out=str(tmp_path), self_distill=2), log=lambda *_: None)


def test_eval_every_writes_a_learning_curve_the_card_can_show(tmp_path, monkeypatch):
    from hf_packed_ss.tools import quality
    from hf_packed_ss.tools import train as train_module

    _, tokenizer = bundled.load("tiny-nemotron-random")
    monkeypatch.setattr(train_module, "train_tokenizer", lambda texts, vocab: tokenizer)
    monkeypatch.setattr(quality, "dev_questions", lambda: ["What is 1 + 1?"])
    monkeypatch.setattr(quality, "held_out_questions", lambda: ["What is 2 + 2?", "What is 3 + 3?"])
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps({"question": f"{i} + 1?", "answer": f"#### {i + 1}"}) for i in range(40)))
    cfg = TrainConfig(format="nemotron", data=str(data), out=str(tmp_path / "run"), steps=3, eval_every=2,
                      eval_width=3, warmup=1, **TINY)
    train_module.train(cfg, log=lambda *_: None)
    rows = [json.loads(line) for line in (tmp_path / "run" / "curve.jsonl").read_text().splitlines()]
    assert sorted({r["step"] for r in rows}) == [0, 2, 3] and len(rows) == 12
    assert {(r["set"], r["prompt"], r["n"]) for r in rows} == {("dev", "trained", 1), ("dev", "bare", 1),
                                                               ("held_out", "trained", 2), ("held_out", "bare", 2)}
    table = quality.curve_table(tmp_path / "run" / "curve.jsonl").splitlines()
    assert len(table) == 5 and table[2].startswith("| 0 | ") and table[-1].count("/2") == 3


def test_distill_pulls_the_drafting_rows_to_the_ar_modes_own_distribution():
    """`distill` mixes the text's cross-entropy with KL from the AR mode's (detached) distribution: zero when the
    drafting rows already agree, and no gradient into the teacher."""
    from hf_packed_ss.tools.train import diffusion_loss

    gen = torch.Generator().manual_seed(0)
    student, teacher = torch.randn(5, 7, generator=gen, requires_grad=True), torch.randn(5, 7, generator=gen,
                                                                                           requires_grad=True)
    tokens = torch.tensor([0, 3, 6, 2, 2])
    ce = torch.nn.functional.cross_entropy(student, tokens)
    assert torch.equal(diffusion_loss(student, tokens, teacher, TrainConfig(distill=0.0)), ce)
    full = diffusion_loss(student, tokens, teacher, TrainConfig(distill=1.0))
    full.backward()
    assert teacher.grad is None and student.grad.abs().sum() > 0
    assert diffusion_loss(teacher.detach(), tokens, teacher, TrainConfig(distill=1.0)).abs() < 1e-6
    half = diffusion_loss(student, tokens, teacher, TrainConfig(distill=0.5))
    assert torch.allclose(half, 0.5 * ce + 0.5 * full)


def test_a_bundled_learning_curve_follows_the_warm_starts_back(tmp_path):
    from hf_packed_ss.bundled import learning_curve

    def run(name, init, steps):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "training_args.json").write_text(json.dumps({"init": str(init) if init else ""}))
        (folder / "curve.jsonl").write_text("".join(json.dumps({"step": s, "set": "dev"}) + "\n" for s in steps))
        return folder

    first = run("a", tmp_path / "stage1-without-a-curve", [0, 50, 100])
    second = run("b", first, [0, 50, 100])
    assert [(r["step"], r["run"]) for r in learning_curve(second)] == [(0, "a"), (50, "a"), (100, "a"), (150, "b"),
                                                                      (200, "b")]
    assert learning_curve(tmp_path) == []


def test_a_learning_curve_that_leads_back_to_itself_ends(tmp_path):
    from hf_packed_ss.bundled import learning_curve

    for name, init in (("a", "b"), ("b", "a")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "training_args.json").write_text(json.dumps({"init": str(tmp_path / init)}))
        (tmp_path / name / "curve.jsonl").write_text(json.dumps({"step": 0}) + "\n" + json.dumps({"step": 10}) + "\n")
    assert [r["step"] for r in learning_curve(tmp_path / "a")] == [0, 10, 20]


def test_a_curve_point_without_a_measurement_reads_a_dash(tmp_path):
    from hf_packed_ss.tools.quality import curve_table

    row = {"step": 5, "set": "dev", "prompt": "trained", "tokens_per_nfe": 2.345, "ended_with_eos": 9, "looping": 1,
           "n": 10}
    (tmp_path / "curve.jsonl").write_text(json.dumps(row) + "\n")
    assert curve_table(tmp_path / "curve.jsonl").splitlines()[-1] == "| 5 | 2.35 | 9/10 | 1/10 | - | - | - | - |"
