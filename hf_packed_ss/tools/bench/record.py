"""One measured response: the per-response numbers of paper section 4 and appendix E.5."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class Record:
    """What one `generate` call of one schedule on one prompt produced.

    Attributes:
        schedule: bench schedule name (`ar`, `packed_ss`, ..., `stock`, `prompt_lookup`); width: W used (0 if none).
        prompt, prompt_id, repeat: which prompt (index into the suite) and which repeat.
        position: where this schedule ran in that prompt's interleaved order (0 = first).
        new_tokens: generated tokens, EOS included. nfe: model forward calls, prompt processing included.
        decoder_time_s: decoder wall time as appendix E.5 defines it (prefill and all decoding, synchronised).
        generate_wall_s: wall time of the whole `generate` call (also its argument checks and set-up).
        model_time_s: time inside model forward calls; non_model_time_s = decoder_time_s - model_time_s.
        rows_per_call: input rows of every call; accepted_per_iteration: tokens appended per iteration;
            width_per_iteration, schedule_per_iteration: each iteration's width and mode (what auto chose).
        compile_time_s: time of the calls that compiled a graph (ours, `+compile`); prompt_time_s: the prompt
            call's model time (ours), so the later calls' cost is (decoder_time_s - prompt_time_s) / (nfe - 1).
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

    schedule: str
    prompt: int
    prompt_id: str
    repeat: int
    position: int
    width: int = 0
    new_tokens: int = 0
    nfe: int = 0
    decoder_time_s: float = 0.0
    generate_wall_s: float = 0.0
    model_time_s: float = 0.0
    rows_per_call: list[int] = field(default_factory=list)
    accepted_per_iteration: list[int] = field(default_factory=list)
    width_per_iteration: list[int] = field(default_factory=list)
    schedule_per_iteration: list[str] = field(default_factory=list)
    compile_time_s: float = 0.0
    prompt_time_s: float = 0.0
    predicted_time_s: float | None = None
    compiled_graphs: int = 0
    near_tie: bool | None = None
    tokens: list[int] = field(default_factory=list)
    text: str | None = None
    correct: bool | None = None
    differs_from_ar: bool | None = None
    error: str | None = None

    @property
    def non_model_time_s(self) -> float:
        return self.decoder_time_s - self.model_time_s

    @property
    def tokens_per_nfe(self) -> float:
        return self.new_tokens / self.nfe if self.nfe else 0.0

    def to_dict(self) -> dict:
        out = asdict(self)
        out.pop("tokens")
        return {**out, "non_model_time_s": self.non_model_time_s, "tokens_per_nfe": self.tokens_per_nfe}
