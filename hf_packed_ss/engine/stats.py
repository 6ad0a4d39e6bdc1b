"""Decoding statistics returned as ``output.decoding_stats`` (paper section 4 and appendix E.5)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class DecodingStats:
    """Counts for one decoded sequence.

    Attributes:
        schedule: the `assistant_mode` used; width: speculative width W (0 for `ar`).
        nfe: model forward passes, prompt processing included.
        new_tokens: generated tokens returned (after EOS / length truncation).
        rows_per_call: input rows of every call, in order.
        accepted_per_iteration: tokens appended to the output by each iteration (a Linear-SS
            iteration is its drafting call plus its verification call).
        model_time_s: wall time inside model forward calls (device-synchronised).
        decoder_time_s: wall time of the whole decode, prefill included, loading and tokenisation excluded.
        prompt_time_s: model time of the first call (the prompt's).
        compile_time_s: wall time of the calls that compiled a graph (a static-cache decode with compile), part
            of `model_time_s` and `decoder_time_s`; 0 when nothing was compiled.
        schedule_per_iteration, width_per_iteration: the mode and width of every iteration's verifying call
            (what `assistant_mode="auto"` chose: "ar" with width 0, or "packed_ss" at a width; constant
            otherwise).
        speculative_branches: hybrid_ss's k (None for every other schedule).
        per_row: for a batch, each row's own statistics (its calls, rows, acceptances and times; the batch's
            fields are the totals: `nfe` batched calls, `rows_per_call` rows computed per call, padding
            included, `new_tokens` over all rows). Empty for one sequence.
    """

    schedule: str
    width: int
    nfe: int = 0
    new_tokens: int = 0
    rows_per_call: list[int] = field(default_factory=list)
    accepted_per_iteration: list[int] = field(default_factory=list)
    schedule_per_iteration: list[str] = field(default_factory=list)
    width_per_iteration: list[int] = field(default_factory=list)
    model_time_s: float = 0.0
    decoder_time_s: float = 0.0
    prompt_time_s: float = 0.0
    compile_time_s: float = 0.0
    speculative_branches: int | None = None
    per_row: list[DecodingStats] = field(default_factory=list)

    @classmethod
    def sequential(cls, rows: list[DecodingStats]) -> DecodingStats:
        """The statistics of sequences decoded one after another (a static-cache batch): every count and time
        summed, each sequence's own in `per_row`."""
        first = rows[0]
        total = cls(schedule=first.schedule, width=first.width, speculative_branches=first.speculative_branches,
                    per_row=list(rows))
        for row in rows:
            total.nfe += row.nfe
            total.new_tokens += row.new_tokens
            total.rows_per_call += row.rows_per_call
            total.accepted_per_iteration += row.accepted_per_iteration
            total.schedule_per_iteration += row.schedule_per_iteration
            total.width_per_iteration += row.width_per_iteration
            total.model_time_s += row.model_time_s
            total.decoder_time_s += row.decoder_time_s
            total.prompt_time_s += row.prompt_time_s
            total.compile_time_s += row.compile_time_s
        return total

    def count_call(self, rows: int, model_time_s: float = 0.0) -> None:
        """One model call of `rows` input rows (its model time, when the counter times it)."""
        self.nfe += 1
        self.rows_per_call.append(rows)
        self.model_time_s += model_time_s

    def count_iteration(self, accepted: int, schedule: str, width: int) -> None:
        """One verifying iteration: the tokens it appended, and the mode and width of its call."""
        self.accepted_per_iteration.append(accepted)
        self.schedule_per_iteration.append(schedule)
        self.width_per_iteration.append(width)

    @property
    def tokens_per_nfe(self) -> float:
        return self.new_tokens / self.nfe if self.nfe else 0.0

    @property
    def non_model_time_s(self) -> float:
        return self.decoder_time_s - self.model_time_s

    def to_dict(self) -> dict:
        return {**asdict(self), "tokens_per_nfe": self.tokens_per_nfe, "non_model_time_s": self.non_model_time_s}
