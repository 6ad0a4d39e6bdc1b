"""One measured response: the per-response numbers of paper section 4 and appendix E.5."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from ...engine.stats import DecodingStats


@dataclass(kw_only=True)
class Record(DecodingStats):
    """What one `generate` call of one schedule on one prompt produced: its `DecodingStats` (our schedules'
    own; for stock `generate`, what forward hooks counted), `schedule` the bench's name for it (`ar`,
    `packed_ss@4`, ..., `stock`, `prompt_lookup`) and `width` the W used (0 if none), and where and how it ran.

    Attributes (besides `DecodingStats`'s):
        prompt, prompt_id, repeat: which prompt (index into the suite) and which repeat.
        position: where this schedule ran in that prompt's interleaved order (0 = first).
        generate_wall_s: wall time of the whole `generate` call (also its argument checks and set-up).
        predicted_time_s: the decode's time as auto's cost model predicted it from what it had measured before
            this decode began (the sum of every call's cost at its rows and the machine's speed then), None when
            auto is not measured or a call's cost was unknown.
        compiled_graphs: graphs dynamo compiled during this decode (0 once warm: a recompile shows here).
        near_tie: for tokens that differ from `ar`'s, whether the first difference is a near-tie of the AR mode's
            own logits (float rounding of another row count or a compiled kernel can flip it; a bug would not
            choose a near-tie), None when not checked.
        tokens: the generated ids (kept in memory for the `ar` comparison, not written out).
        text, correct, differs_from_ar: filled after timing (detokenised output, grade, greedy identity).
        error: why the call failed (then the numbers are zero).
    """

    width: int = 0
    prompt: int
    prompt_id: str
    repeat: int
    position: int
    generate_wall_s: float = 0.0
    predicted_time_s: float | None = None
    compiled_graphs: int = 0
    near_tie: bool | None = None
    tokens: list[int] = field(default_factory=list)
    text: str | None = None
    correct: bool | None = None
    differs_from_ar: bool | None = None
    error: str | None = None

    def to_dict(self) -> dict:
        """What results.json keeps: every field and rate but the tokens (and a batch's `per_row`, always empty)."""
        out = super().to_dict()
        del out["tokens"], out["per_row"]
        return out


def stats_fields(stats: DecodingStats) -> dict:
    """A decode's `DecodingStats` as `Record` fields (its `schedule`, the assistant mode, left to the bench's
    name; a batch's `per_row` left out)."""
    return {f.name: getattr(stats, f.name) for f in fields(DecodingStats) if f.name not in ("schedule", "per_row")}
