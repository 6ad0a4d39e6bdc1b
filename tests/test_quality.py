"""The drafting-quality measurement behind the model cards' Status blocks: its degeneracy checks, the held-out
questions (disjoint from everything a checkpoint was trained or tuned on), the adapter drafter's bar (the base
model's own greedy output) and the regenerated card block."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from hf_packed_ss import bundled
from hf_packed_ss.tools.bench.suites import GSM8K_TEST, SAMPLE, SHOTS, read_jsonl
from hf_packed_ss.tools.quality import (
    END,
    FIRST,
    HELD_OUT,
    HELD_OUT_FILE,
    START,
    TEST_SIZE,
    adapter_base,
    base_greedy,
    gsm8k_questions,
    held_out_questions,
    main,
    max_ngram_repeats,
    measure,
    measure_widths,
    seen_test_indices,
    table,
    verdict,
)

TRAIN = GSM8K_TEST.with_name("train.jsonl")


def test_max_ngram_repeats_counts_the_most_frequent_6gram():
    assert max_ngram_repeats([1, 2, 3]) == 0
    assert max_ngram_repeats(list(range(20))) == 1
    loop = [7, 8, 9] * 6  # 18 tokens: (7, 8, 9, 7, 8, 9) starts at 0, 3, 6, 9, 12
    assert max_ngram_repeats(loop) == 5


def test_held_out_indices_avoid_every_test_question_a_checkpoint_was_tuned_on():
    seen = seen_test_indices()
    assert set(FIRST) <= seen and set(range(0, 30)) <= seen  # the bar's questions, the sample, the prompt choice
    assert not set(HELD_OUT) & seen
    assert len(HELD_OUT) == 20 and HELD_OUT.stop == TEST_SIZE  # the tail of the split
    # the bundled copy is exactly those indices, and none of its questions is a sample, shot or first-30 question
    rows = read_jsonl(HELD_OUT_FILE)
    assert [r["index"] for r in rows] == list(HELD_OUT)
    assert held_out_questions(file=HELD_OUT_FILE) == [r["question"] for r in rows]
    assert held_out_questions(3, file=HELD_OUT_FILE) == [r["question"] for r in rows[:3]]
    known = {r["question"] for r in read_jsonl(SAMPLE) + read_jsonl(SHOTS)}
    assert not {r["question"] for r in rows} & known
    assert len({r["question"] for r in rows}) == len(rows)


def test_every_bundled_checkpoint_was_trained_on_gsm8k_train_only():
    for name in bundled.names():
        args = bundled.path(name) / "training_args.json"
        if args.is_file():  # tiny-nemotron-random is untrained
            assert Path(json.loads(args.read_text())["data"]).name == "train.jsonl", name


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def _grams(text: str, n: int = 8) -> set[tuple[str, ...]]:
    words = _words(text)
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


@pytest.mark.skipif(not (GSM8K_TEST.is_file() and TRAIN.is_file()), reason="needs the shared GSM8K split")
def test_held_out_questions_share_no_8gram_with_train_and_match_the_split():
    test = read_jsonl(GSM8K_TEST)
    assert len(test) == TEST_SIZE
    assert read_jsonl(HELD_OUT_FILE) == [{"index": i, **test[i]} for i in HELD_OUT]
    assert held_out_questions() == held_out_questions(file=HELD_OUT_FILE) == [test[i]["question"] for i in HELD_OUT]
    train = set().union(*(_grams(r["question"]) for r in read_jsonl(TRAIN)))
    tuned = {test[i]["question"] for i in seen_test_indices()}
    for question in held_out_questions():
        # no near-copy of any train question (the drafter's base-answer questions and the shots are train ones)
        assert not _grams(question) & train, question
        assert question not in tuned
    assert gsm8k_questions(limit=len(FIRST)) == [test[i]["question"] for i in FIRST]


def _joint(differs=0, ended=10, repeats=2, tokens_per_nfe=1.8, looping=None, n=10):
    row = {"tokens_per_nfe": tokens_per_nfe, "ended_with_eos": ended, "max_6gram_repeats": repeats,
           "looping": int(repeats > 3) if looping is None else looping, "n": n}
    return {"ar": {**row, "tokens_per_nfe": 1.0, "differs_from_ar": 0, "differing_questions": []},
            "packed_ss": {**row, "differs_from_ar": differs, "differing_questions": list(range(differs))}}


def test_joint_bar_counts_eos_repeats_identity_and_tokens_per_nfe():
    assert verdict(_joint(), 1.7, adapter=False) == "met"
    assert "1 of 10 answers repeat a 6-gram more than 3 times (worst: 4" in verdict(_joint(repeats=4), 1.7, False)
    assert verdict(_joint(repeats=4, looping=1, ended=18, n=20), 1.7, False) == "met"  # 1 of 20 may loop
    assert "2 of 20 answers repeat" in verdict(_joint(repeats=4, looping=2, ended=18, n=20), 1.7, False)
    assert "16/20 end with EOS" in verdict(_joint(ended=16, n=20), 1.7, adapter=False)  # 17 of 20 must end
    assert "7/10 end with EOS" in verdict(_joint(ended=7), 1.7, adapter=False)
    assert "packed_ss differs from ar on 1 of 10" in verdict(_joint(differs=1), 1.7, adapter=False)
    assert "1.60 tokens/NFE" in verdict(_joint(tokens_per_nfe=1.6), 1.7, adapter=False)


def test_bare_questions_need_most_answers_to_end_and_identity_only():
    assert verdict(_joint(ended=14, repeats=9, looping=5, tokens_per_nfe=1.1, n=20), 2.0, False, bare=True) == "met"
    assert "13/20 end with EOS (at least 70%)" in verdict(_joint(ended=13, n=20), 2.0, False, bare=True)
    assert "differs from ar" in verdict(_joint(ended=20, differs=1, n=20), 2.0, False, bare=True)


def test_adapter_bar_leaves_the_bases_repeats_and_eos_to_the_base():
    def adapter_report(differs):
        report = _joint(ended=3, repeats=9)
        for r in report.values():
            r["differs_from_base"] = r.pop("differs_from_ar")
        report["packed_ss"]["differs_from_base"] = differs
        return report

    assert verdict(adapter_report(0), 1.5, adapter=True) == "met"  # 3/10 EOS and 9 repeats are the base's
    assert "packed_ss differs from the base on 2 of 10" in verdict(adapter_report(2), 1.5, adapter=True)
    base = {"ended_with_eos": 3, "max_6gram_repeats": 9, "looping": 1, "n": 10}
    text = table(adapter_report(0), 5, "base", base)
    assert "| base (stock `generate`, the reference) | 0 | 1.00 | 3/10 | 9 | 1 | - |" in text
    assert "| packed_ss | 5 | 1.80 | = base | = base | = base | 0 |" in text
    # an output that is not the base's is its own: its figures are shown
    assert "| packed_ss | 5 | 1.80 | 3/10 | 9 | 1 | 2 |" in table(adapter_report(2), 5, "base", base)


def _drafter(folder: Path, perturb_verifier: bool = False):
    """A tiny random Llama saved to `folder` (the untouched base on disk) under a random proposal-only LoRA;
    with `perturb_verifier` the in-memory base is changed after saving, so the drafter's AR mode is no longer
    the base model's."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from hf_packed_ss.models.smollm2 import MaskEmbedding, attach_drafter

    tokenizer = AutoTokenizer.from_pretrained(bundled.path("smollm2-135m-drafter"))
    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                        max_position_embeddings=2048, eos_token_id=tokenizer.eos_token_id,
                                        pad_token_id=tokenizer.eos_token_id)).to(torch.float64).eval()
    with torch.no_grad():  # sharper logits than the default init: greedy output without near-ties
        for p in base.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
    base.save_pretrained(folder)
    if perturb_verifier:
        with torch.no_grad():
            base.lm_head.weight.add_(torch.randn_like(base.lm_head.weight) * 0.2)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"],
                                            init_lora_weights=False))
    next(iter(model.peft_config.values())).base_model_name_or_path = str(folder)
    attach_drafter(model, block_size=4, mask_embedding=MaskEmbedding(32).to(torch.float64))
    return model.eval(), tokenizer


@pytest.mark.parametrize("perturb", [False, True])
def test_adapter_bar_compares_every_schedule_with_the_base_models_own_greedy_output(tmp_path, perturb):
    model, tokenizer = _drafter(tmp_path / "base", perturb_verifier=perturb)
    base = adapter_base(model)
    assert base is not None and not hasattr(base, "peft_config") and base.dtype == torch.float64
    questions = held_out_questions(2)
    reference = base_greedy(base, tokenizer, questions, max_new_tokens=10)
    assert all(len(r) == 10 for r in reference)
    report = measure(model, tokenizer, questions, ["ar", "packed_ss"], 3, 10, reference=reference,
                     reference_name="base")
    if perturb:  # a verifier that is not the untouched base fails the bar
        assert all(r["differs_from_base"] == 2 for r in report.values())
        assert verdict(report, None, adapter=True).startswith("not met: ar differs from the base on 2 of 2")
    else:
        assert all(r["differs_from_base"] == 0 for r in report.values())
        assert verdict(report, None, adapter=True) == "met"


def test_several_widths_add_packed_ss_rows_and_the_bar_takes_the_best(tmp_path):
    """`--width 2 3`: every schedule at W = 2, the speculative ones again at W = 3, each row marked with its
    width; the tokens/NFE bar is judged at the best width, and the verdict names it."""
    model, tokenizer = _drafter(tmp_path / "base")
    questions = held_out_questions(2)
    reference = base_greedy(adapter_base(model), tokenizer, questions, max_new_tokens=10)
    report = measure_widths(model, tokenizer, questions, ["ar", "packed_ss"], [2, 3], max_new_tokens=10,
                            reference=reference, reference_name="base")
    assert list(report) == ["ar", "packed_ss", "packed_ss@3"]
    assert [(r["mode"], r["width"]) for r in report.values()] == [("ar", 0), ("packed_ss", 2), ("packed_ss", 3)]
    assert all(r["differs_from_base"] == 0 for r in report.values())
    rows = [line for line in table(report, 2, "base").splitlines() if line.startswith("| packed_ss |")]
    assert [row.split(" | ")[1] for row in rows] == ["2", "3"]
    report["packed_ss"]["tokens_per_nfe"], report["packed_ss@3"]["tokens_per_nfe"] = 1.9, 2.1
    assert verdict(report, 2.0, adapter=True) == "met at W = 3"
    report["packed_ss@3"]["tokens_per_nfe"] = 1.95
    assert "Packed-SS 1.95 tokens/NFE at best (W = 3) (at least 2.0)" in verdict(report, 2.0, adapter=True)


def test_code_sets_are_for_adapter_drafters():
    with pytest.raises(SystemExit):
        main(["tiny-nemotron-random", "--limit", "1", "--held-out", "0", "--code", "1"])


def test_a_joint_checkpoint_has_no_adapter_base():
    model, _ = bundled.load("tiny-nemotron-random")
    assert adapter_base(model) is None


def test_quality_command_rewrites_only_the_card_block(tmp_path, capsys):
    card = tmp_path / "README.md"
    card.write_text(f"# card\n\n{START}\nold\n{END}\n\nafter\n")
    assert main(["tiny-nemotron-random", "--limit", "2", "--held-out", "2", "--max-new-tokens", "8", "--width", "3",
                 "--bare", "--card", str(card)]) == 0
    text = card.read_text()
    assert "old" not in text and text.startswith("# card\n\n") and text.endswith(f"{END}\n\nafter\n")
    block = text.split(START)[1].split(END)[0]
    assert ("python -m hf_packed_ss.tools.quality tiny-nemotron-random --limit 2 --held-out 2 --max-new-tokens 8"
            " --width 3 --bare" in block)
    first, rest = block.split("**First 2 GSM8K test questions (test 0-1)")[1].split("held-out GSM8K test questions", 1)
    held_out, bare = rest.split("as bare questions")
    assert "(test 1299-1300" in held_out
    for part in (first, held_out, bare):
        rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in part.splitlines()
                if line.startswith("| ")}
        assert set(rows) >= {"ar", "linear_ss", "quadratic_ss", "packed_ss"}
        assert rows["packed_ss"][1] == "3" and rows["packed_ss"][-1].strip(" |") == "0"  # identical to ar
        assert rows["ar"][3].endswith("/2")
    assert block.count("Bar: ") == 3
    assert block.strip() in capsys.readouterr().out
