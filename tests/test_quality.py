"""The drafting-quality measurement behind the model cards' Status blocks: its degeneracy checks and the
regenerated card block."""

from __future__ import annotations

from hf_packed_ss.quality import END, START, main, max_ngram_repeats


def test_max_ngram_repeats_counts_the_most_frequent_6gram():
    assert max_ngram_repeats([1, 2, 3]) == 0
    assert max_ngram_repeats(list(range(20))) == 1
    loop = [7, 8, 9] * 6  # 18 tokens: (7, 8, 9, 7, 8, 9) starts at 0, 3, 6, 9, 12
    assert max_ngram_repeats(loop) == 5


def test_quality_command_rewrites_only_the_card_block(tmp_path, capsys):
    card = tmp_path / "README.md"
    card.write_text(f"# card\n\n{START}\nold\n{END}\n\nafter\n")
    assert main(["tiny-nemotron-random", "--limit", "2", "--max-new-tokens", "8", "--width", "3",
                 "--card", str(card)]) == 0
    text = card.read_text()
    assert "old" not in text and text.startswith("# card\n\n") and text.endswith(f"{END}\n\nafter\n")
    block = text.split(START)[1].split(END)[0]
    assert "python -m hf_packed_ss.quality tiny-nemotron-random --limit 2 --max-new-tokens 8 --width 3" in block
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in block.splitlines() if line.startswith("| ")}
    assert set(rows) >= {"ar", "linear_ss", "quadratic_ss", "packed_ss"}
    assert rows["packed_ss"][1] == "3" and rows["packed_ss"][-1].strip(" |") == "0"  # identical to ar
    assert rows["ar"][3].endswith("/2")
    assert block.strip() in capsys.readouterr().out
