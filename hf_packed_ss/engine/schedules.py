"""Decoding schedules, by `assistant_mode` name: what each call asks, and what it decides.

A schedule is model-agnostic: it holds the draft D_{t-1} (tokens by output position, with the proposal
distribution Q each was drawn from), turns the active window into a `Plan`, and turns the call's `CallResult`
into a `Verdict`. The loop owns the accepted tokens, the cache, stopping and statistics; a layout says which
ranks each proposal scored. The same classes drive both families: the shifted-block layout (appendix D.1)
hands them a contiguous left-to-right window, the same-position layout (D.2) any order over a window.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache, partial

import torch

from .acceptance import Acceptance, Greedy, ProposalDistribution, probabilities
from .contract import EMPTY, CallResult, Plan, Proposal, Verdict
from .order import ORDERS
from .rows import MASK, engine_layout, model_free_calls
from .width import Measured, WidthChooser

HYBRID = "hybrid_ss"
DEFAULT_BRANCHES = 2  # `speculative_branches` when unset: the smallest hybrid that is neither endpoint


def check_branches(k, width: int) -> int:
    """`speculative_branches` k for speculative width W: an integer in [1, W + 1] (1 = Packed-SS's single branch,
    W + 1 = Quadratic-SS's full set). Returns k; raises ValueError otherwise."""
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= width + 1:
        raise ValueError(
            f"speculative_branches={k!r} is out of range: use an integer in [1, {width + 1}] for speculative_width="
            f"{width} (1 = Packed-SS's single branch from P_(t-1), W + 1 = {width + 1} = Quadratic-SS's full set; "
            f"default {DEFAULT_BRANCHES}).")
    return k


@dataclass
class Draft:
    """D_{t-1}: draft tokens at output positions (the tokens stay on the model's device) and the Q they were
    drawn from (None under greedy decoding)."""

    positions: tuple[int, ...] | range = ()
    tokens: torch.Tensor = EMPTY
    q: ProposalDistribution | None = None
    index: dict[int, int] | None = None  # position -> row of `tokens` and `q` (None for a range)

    def __post_init__(self):
        if self.index is None and type(self.positions) is not range:
            self.index = {j: i for i, j in enumerate(self.positions)}

    def numel(self) -> int:
        return len(self.positions)

    def __getitem__(self, rows: slice) -> Draft:
        return Draft(self.positions[rows], self.tokens[rows], None if self.q is None else self.q[rows])

    def rows(self, order) -> slice | list[int]:
        """Rows of the draft at ranks 0..kappa-1 of `order` (kappa: ranks before the first without a draft)."""
        positions = self.positions
        if isinstance(positions, range) and isinstance(order, range):  # left to right: arithmetic, no lookups
            first = order.start - positions.start
            if not order or not 0 <= first < len(positions):
                return slice(0, 0)
            return slice(first, first + min(len(order), len(positions) - first))
        out = []
        for j in order:
            i = positions.index(j) if isinstance(positions, range) and j in positions else self.index.get(j)
            if i is None:
                break
            out.append(i)
        if out and out == list(range(out[0], out[0] + len(out))):
            return slice(out[0], out[0] + len(out))
        return out

    def at(self, order) -> torch.Tensor:
        """The draft tokens at the leading ranks of `order`."""
        return self.tokens[self.rows(order)]


class Schedule:
    """Base class. Subclasses implement `plan` and `advance`.

    Attributes:
        name: the `assistant_mode` string.
        width: speculative width W.
        speculative: whether it drafts at all (AR does not: its reported width is 0).
        exact: whether its output is the AR mode's (every schedule here; SetDLM's native decoder is not).
        options: the `generate` options it takes besides `speculative_width` and `verify_order`.
        verifies: whether it verifies drafts (SetDLM's native decoder commits by threshold instead).
        default_width_cap: the largest default width, if smaller than the model's (Quadratic-SS: B = 8).
        stop_at_eos: an accepted EOS at position j ends the output at j.
        context_length: keep cache + call rows within this many by dropping the oldest cache rows (or None).
        speculative_branches: hybrid_ss's k (None for the other schedules).
    """

    name: str = ""
    speculative: bool = True
    exact: bool = True
    options: tuple[str, ...] = ()
    verifies: bool = True
    default_width_cap: int | None = None
    stop_at_eos: bool = True
    context_length: int | None = None
    speculative_branches: int | None = None

    def __init__(self, width: int, acceptance: Acceptance | None = None, verify_order: str = "ltr"):
        self.width = width
        self.acceptance = acceptance or Greedy()
        self.order = ORDERS[verify_order]
        self.scores_order = verify_order != "ltr"  # LTR ignores scores: skip their softmax on every call
        self.draft = Draft()
        self.score: dict[int, float] = {}  # appendix E.6 confidence score per position
        self.started = False  # a call has been made
        self.drafts_from_pending = True  # the layout can draft in a call that processes the pending rows
        self.branches_past_draft = True  # the layout can branch past the drafted ranks (D.3's static regions)

    @property
    def q(self) -> ProposalDistribution | None:
        return self.draft.q

    def begin(self, layout, length: int, device: torch.device) -> None:
        """Called once before the first call with the layout and the number of output positions."""
        self.drafts_from_pending = layout.drafts_from_pending
        self.branches_past_draft = layout.branches_past_draft

    def choose(self, stats) -> None:
        """Before each call's window is taken (`stats`: the decode's statistics so far): a schedule that picks
        its width per call (`AutoSchedule`) sets `width` here."""

    def current(self) -> tuple[str, int]:
        """The mode and width of the call being made (what `decoding_stats` records per iteration)."""
        return self.name, self.width if self.speculative else 0

    def plan(self, window: tuple[int, ...]) -> Plan:
        raise NotImplementedError

    def advance(self, plan: Plan, result: CallResult) -> Verdict:
        """Consume a call's result: the verdict (`Verdict.drafting()` for a call that verified nothing)."""
        raise NotImplementedError

    def verify(self, plan: Plan, result: CallResult) -> Verdict:
        """Algorithm 1, lines 5-6 (Algorithm 3, lines 7 and 9-10): check the draft in rank order against its
        stored Q; A_t = min(h + 1, u) tokens are accepted, the last one the verifier's unless the window is full."""
        kappa = plan.available
        q = None if self.draft.q is None or not kappa else self.draft.q[self.draft.rows(plan.order[:kappa])]
        values, tokens, h = self.acceptance.decide(plan.draft, q, result.verifier)
        bonus = h == kappa < len(tokens)
        kind = "verifier" if not kappa else "bonus" if bonus else "correction"
        return Verdict(tokens, plan.positions(range(len(tokens))), h, bonus, kind, values)

    def draft_from(self, plan: Plan, result: CallResult, proposal: int, resolved: int, scored: bool = True) -> None:
        """Algorithm 1, line 10 (Algorithm 3, line 15): the rows of `proposal` that score ranks past the
        `resolved` ones become D_t."""
        ranks = result.proposal_ranks[proposal]
        first = max(resolved, ranks.start)
        positions = plan.positions(range(first, ranks.stop))
        if not positions:  # the whole window was accepted
            self.draft = Draft()
            self.score = {} if scored else self.score
            return
        logits = result.proposals[proposal][first - ranks.start :]
        tokens, q = self.acceptance.propose(logits)
        self.draft = Draft(positions, tokens, q)
        if scored and self.scores_order:  # E.6: the probability the drafter gave its token when proposing it
            self.score = dict(zip(positions, confidence_of(tokens, q, logits).tolist(), strict=True))


def confidence_of(tokens: torch.Tensor, q: ProposalDistribution | None, logits: torch.Tensor) -> torch.Tensor:
    """The probability the drafter gave each proposed token (its stored Q when sampling)."""
    return q.prob(tokens) if q is not None else probabilities(logits).gather(-1, tokens[:, None])[:, 0]


class ARSchedule(Schedule):
    """The exactness reference: each call verifies an empty draft at the leftmost position and emits its token."""

    name = "ar"
    speculative = False

    def plan(self, window: tuple[int, ...]) -> Plan:
        return Plan(order=window[:1])

    def advance(self, plan: Plan, result: CallResult) -> Verdict:
        return self.verify(plan, result)


class PackedSSSchedule(Schedule):
    """Algorithm 1: verify D_{t-1} and draft the next block from P_{t-1} in the same call.

    Algorithm 1, line by line: `plan` asks lines 3-4 in one call (verifier queries for d^(1..|D|) and the bonus
    position, and the drafter block Z_t from P_{t-1}); `advance` is lines 5-6 (`verify`: h_t, C_t, A_t) and
    line 10 (`draft_from`: D_t, the proposals past the A_t accepted positions); lines 7-9 (stop at EOS or the
    length limit, P_t = P_{t-1} + C_t) are the loop's, shared by every schedule. Algorithm 3 is the same code
    over a window in order pi_t.

    Packed-SS asks one proposal branch, from P_{t-1}; a set of branches b = 0..k-1 (branch b drafted from
    P_{t-1} plus the draft at ranks < b) generalises it: Quadratic-SS asks every branch, `hybrid_ss` the
    first k. After h acceptances the largest branch <= h supplies D_t, its rows for the ranks left unresolved.
    """

    name = "packed_ss"
    anchored = True  # the shifted-block form after the first call (see `Proposal`)

    def branches(self, kappa: int, u: int) -> range:
        """The branches to ask: every one a verification can select is b <= kappa; a same-position layout
        also lays out D.3's regions up to u - 1 (they repeat region kappa's context)."""
        return range(1)

    def plan(self, window: tuple[int, ...]) -> Plan:
        order = self.order(window, self.score)  # pi_t (left to right on the shifted-block layout)
        draft = self.draft.at(order[: self.width])  # D_{t-1}, line 4 (at most W: a draft made at a wider W is cut)
        anchored = self.anchored and self.started  # appendix E.2: the first call drafts a whole block, unanchored
        return Plan(order, draft, proposals=_proposals(self.branches(draft.numel(), len(order)), anchored))

    def advance(self, plan: Plan, result: CallResult) -> Verdict:
        verdict = self.verify(plan, result)  # lines 5-6: h_t, C_t = d^(1..h_t) + v^(h_t + 1)
        self.started = True
        selected = max(i for i, p in enumerate(plan.proposals) if p.branch <= verdict.h)
        self.draft_from(plan, result, selected, len(verdict.tokens))  # line 10: D_t, past the A_t accepted
        return verdict


@lru_cache(maxsize=256)
def _proposals(branches: range, anchored: bool) -> tuple[Proposal, ...]:
    return tuple(Proposal(b, anchored) for b in branches)


class QuadraticSSSchedule(PackedSSSchedule):
    """One proposal branch per acceptance boundary: B verifier rows + B branches of B rows (appendix D.1)."""

    name = "quadratic_ss"
    anchored = False
    default_width_cap = 7  # the paper's Quadratic-SS block size B = 8 (section 4.1): its input grows as B(B + 1)

    def branches(self, kappa: int, u: int) -> range:
        return range(u if self.branches_past_draft else kappa + 1)


class HybridSSSchedule(QuadraticSSSchedule):
    """The k-branch hybrid the paper's section 5 names as future work: branches b = 0..k-1 (clipped to those
    Quadratic-SS asks); after h acceptances branch min(h, k - 1) drafts. Rows per call after the first on the
    shifted-block layout: (1 + |D|) verifier rows + k blocks of B = W + 1 rows, at most B + kB.

    Block form (**decision**: anchored iff k == 1). Every form is exact (a proposal only changes what is
    verified, never what is accepted), so the form is chosen for the two endpoints and a monotone family
    between them: k = 1 keeps Packed-SS's anchored ``[last, MASK x W]`` block, so it makes exactly Packed-SS's
    calls, rows and acceptances; k >= 2 uses Quadratic-SS's unanchored ``[MASK x B]`` blocks, which draft one
    position more: whenever h < k the selected branch b = h leaves a full W-token draft, exactly as
    Quadratic-SS, so k = W + 1 makes exactly Quadratic-SS's calls, rows and acceptances. The same-position
    layout has one block form; there k = 1 is Packed-SS's region 0 and k >= u Quadratic-SS's 0..u-1.
    """

    name = HYBRID
    options = ("speculative_branches",)
    default_width_cap = None

    def __init__(self, width: int, acceptance: Acceptance | None = None, verify_order: str = "ltr",
                 speculative_branches: int = DEFAULT_BRANCHES):
        super().__init__(width, acceptance, verify_order)
        self.speculative_branches = check_branches(speculative_branches, width)
        self.anchored = self.speculative_branches == 1

    def branches(self, kappa: int, u: int) -> range:
        return range(min(self.speculative_branches, len(super().branches(kappa, u))))


class LinearSSSchedule(Schedule):
    """Draft from the newest prefix, then verify: two calls per iteration (paper section 1; p + 3u rows on the
    same-position layout). On the shifted-block layout a drafting call cannot process the pending tokens, so
    the first call prefills the prompt and emits the first token (appendix E.2). Its confidence score is the
    verifier's top probability at each position in the previous iteration (appendix E.6); the order is fixed
    before the drafting call."""

    name = "linear_ss"

    def __init__(self, width: int, acceptance: Acceptance | None = None, verify_order: str = "ltr"):
        super().__init__(width, acceptance, verify_order)
        self.pending_order: tuple[int, ...] | None = None  # the drafted order, verified by the next call

    def plan(self, window: tuple[int, ...]) -> Plan:
        if not self.started and not self.drafts_from_pending:
            return Plan(order=window[:1])  # prefill: verify the empty draft
        if self.pending_order is None:
            return Plan(self.order(window, self.score), verify=False, proposals=(Proposal(0, anchored=True),))
        return Plan(self.pending_order, self.draft.at(self.pending_order))

    def advance(self, plan: Plan, result: CallResult) -> Verdict:
        self.started = True
        if not plan.verify:
            self.draft_from(plan, result, 0, 0, scored=False)
            self.pending_order = plan.order
            return Verdict.drafting()
        verdict = self.verify(plan, result)
        if self.scores_order:
            top = probabilities(result.verifier).max(dim=-1).values.tolist()
            self.score = dict(zip(plan.order, top, strict=False))
        self.draft, self.pending_order = Draft(), None
        return verdict


@lru_cache(maxsize=256)
def _call_rows(layout_class, static_shapes: bool, width: int) -> tuple[int, tuple[int, ...]]:
    layout = layout_class(MASK, static_shapes)
    ar = model_free_calls(ARSchedule(1), layout, False, 4)[1].rows
    # accepting 0, 0, then k and 0 in turn for k = 0..W-1: the call after a rejection finds W - 1 draft tokens
    # and accepts k, so the call after it finds W - 1 - k: every draft length n = 0..W-1 is met
    accept = [0, 0, *(h for k in range(width) for h in (k, 0))]
    calls = model_free_calls(PackedSSSchedule(width), layout, accept, width * (width + 3) // 2 + 3 * width + 8)
    found = {c.drafted: c.rows for c in calls[2 : len(accept)]}
    assert sorted(found) == list(range(width)), f"a probe of Packed-SS at W = {width} met the drafts {sorted(found)}"
    return ar, tuple(found[n] for n in range(width))


def call_rows(layout, width: int) -> tuple[int, tuple[int, ...]]:
    """(rows of an AR call, rows of a Packed-SS call at `width` that finds a draft of n tokens, for n = 0..W-1)
    on `layout`'s engine class and shape policy, read off the engine by the model-free probe (`rows.model_free_calls`).
    Kept per layout class, shape policy and width."""
    return _call_rows(engine_layout(layout), bool(layout.static_shapes), width)


class AutoSchedule(PackedSSSchedule):
    """`assistant_mode="auto"` (and `speculative_width="auto"`): before every call a `WidthChooser` picks AR or
    Packed-SS at one of `widths` by predicted throughput, by the policy `measured` runs by (`policy.AutoPolicy`);
    every arm is exact, so the output is AR's whatever it picks. An AR call drops the draft; a wider call than
    the last one verifies what the draft has (the draft was cut to W by `PackedSSSchedule.plan` when it narrows).
    Each verification reports how far past its drafter's prefix every draft token sat and how many survived (the
    acceptance profile)."""

    name = "auto"

    def __init__(self, width: int, acceptance: Acceptance | None = None, verify_order: str = "ltr",
                 widths: tuple[int, ...] | None = None, ar: bool = True, measured: Measured | None = None):
        widths = tuple(widths or range(1, width + 1))
        super().__init__(max(widths), acceptance, verify_order)
        self.chooser = WidthChooser(widths, ar, measured if measured is not None else Measured())
        self.arm = self.width  # 0: AR
        self.base: int | None = None  # the first position after the prefix the stored draft was made from

    def begin(self, layout, length: int, device: torch.device) -> None:
        super().begin(layout, length, device)
        self.chooser.start(partial(call_rows, layout))

    def choose(self, stats) -> None:
        self.arm = self.chooser.choose(stats.rows_per_call[-1] if stats.rows_per_call else None)
        self.width = max(self.arm, 1)

    def current(self) -> tuple[str, int]:
        return (ARSchedule.name, 0) if not self.arm else (PackedSSSchedule.name, self.arm)

    def plan(self, window: tuple[int, ...]) -> Plan:
        if not self.arm:
            if self.base is not None:  # an AR call drops the draft
                self.draft, self.base = Draft(), None
            return Plan(order=window[:1])
        return super().plan(window)

    def advance(self, plan: Plan, result: CallResult) -> Verdict:
        if not plan.proposals:  # an AR call
            self.started = True
            return self.verify(plan, result)
        verdict = super().advance(plan, result)
        if self.arm >= 2 and self.chooser.previous == self.arm:  # a call after a switch finds another width's draft
            self.chooser.tally(self.arm, verdict.h + 1)
        if plan.available and self.base is not None:
            self.chooser.observe(plan.position(0) - self.base, plan.available, verdict.h)
        self.base = plan.position(0)
        return verdict


NATIVE_CACHE_ORDERS = ("position", "first_hitting")
NATIVE_CONTEXTS = ("full", "sliding")


@dataclass(frozen=True)
class FirstHittingTimes:
    """The first-hitting times of the release's StaggeredNoise schedule (`compute_first_hitting_times`).

    T_j = loc_j + b (1 - exp(-E_j / k)) with E_j ~ Exp(1), where loc runs down from 1 - b to 0 over
    `block_size` positions and output position j takes entry ``block_size - n + j`` of it (n output
    positions); k and b follow from the set size d (area d / (2 length)) as in `init_schedule`."""

    length: int
    block_size: int
    desired_block_size: int
    max_block_size: int
    k: float | None = None
    b: float | None = None

    @classmethod
    def from_config(cls, config) -> FirstHittingTimes:
        """Sizes from a `SetDLMConfig`: block_size is both the noise block and the length (as in the
        release's GSM8K models); d defaults to max_block_size // 2 (the release trains smax = 2 d)."""
        d = getattr(config, "desired_block_size", None) or max(1, config.max_block_size // 2)
        return cls(config.block_size, config.block_size, d, config.max_block_size,
                   getattr(config, "noise_k", None), getattr(config, "noise_b", None))

    def shape(self) -> tuple[float, float]:
        """(k, b)."""
        area = 1 / (2 * (self.length / self.desired_block_size))
        if self.k is not None:
            return self.k, area * (self.k + 1) / self.k
        if self.b is not None:
            return area / (self.b - area), self.b
        if self.desired_block_size not in (1, self.max_block_size):
            b = self.max_block_size / (self.block_size + self.max_block_size - 1)
            return area / (b - area), b
        return 1.0, area * 2.0

    def sample(self, n: int, device: torch.device, generator: torch.Generator | None = None) -> list[float]:
        """One draw for output positions 0..n-1 (one `exponential_` call of shape (1, n), float64, on
        `device`: the same random stream as the release's draw at the start of `SetDLM.generate`)."""
        if n > self.block_size:
            raise ValueError(
                f"native_cache_order='first_hitting' draws one first-hitting time per output position from the "
                f"release's schedule over block_size={self.block_size} positions; use max_new_tokens <= "
                f"{self.block_size} or native_cache_order='position'.")
        if n == 0:
            return []
        k, b = self.shape()
        e = torch.empty(1, n, dtype=torch.float64, device=device).exponential_(generator=generator)
        loc = torch.linspace(0.0, 1.0 - b, self.block_size, dtype=torch.float64).flip(0)[None, -n:].to(device)
        return (loc + b * -torch.expm1(-e / k))[0].tolist()


class NativeSchedule(Schedule):
    """SetDLM's own sliding-window threshold decoder (not exact; a speed/accuracy reference).

    Each call drafts every masked position of the window from the committed tokens and commits the
    most confident one plus every one whose probability is at least `confidence_threshold`. The
    committed tokens are the next call's N rows (causal among themselves, in the order returned):

    - ``native_cache_order="position"``: by position; ``"first_hitting"``: by first-hitting time,
      latest first (the release's ``setdlm_fht_cache_order``, on in its GSM8K harness), with times
      drawn once per run from the release's StaggeredNoise schedule (`FirstHittingTimes`).
    - ``stop_at_eos=False``: EOS is an ordinary token (the release decodes every position).
    - ``native_context="sliding"``: before each call the oldest cache rows are dropped so that cache +
      call rows <= the trained length ``config.block_size`` (the release's ``_crop_kv_cache_left``).
    """

    name = "native"
    exact = False
    verifies = False
    options = ("confidence_threshold", "native_cache_order", "stop_at_eos", "native_context")

    def __init__(self, width: int, acceptance: Acceptance | None = None, verify_order: str = "ltr",
                 confidence_threshold: float = 0.9, native_cache_order: str = "position", stop_at_eos: bool = True,
                 native_context: str = "full", config=None):
        super().__init__(width, acceptance, verify_order)
        if native_cache_order not in NATIVE_CACHE_ORDERS:
            raise ValueError(f"native_cache_order={native_cache_order!r}: choose 'position' (the default) or "
                             "'first_hitting' (the release's GSM8K harness, SETDLM_FHT_CACHE_ORDER=true).")
        if native_context not in NATIVE_CONTEXTS:
            raise ValueError(f"native_context={native_context!r}: choose 'full' (the default) or 'sliding' (the "
                             "release's left-cropped cache past the trained length).")
        if not isinstance(stop_at_eos, bool):
            raise ValueError(f"stop_at_eos={stop_at_eos!r} must be True (the default) or False (the release: never "
                             "stop at EOS).")
        if (native_cache_order, native_context) == ("first_hitting", "sliding"):
            raise ValueError("native_cache_order='first_hitting' with native_context='sliding' is not supported (past "
                             "the trained length the release then crops by position and masks by position id, which "
                             "is not reproduced): choose one of them.")
        if config is None and (native_cache_order, native_context) != ("position", "full"):
            raise ValueError("native_cache_order='first_hitting' and native_context='sliding' read the model "
                             "config: pass config=model.config.")
        if native_context == "sliding" and 2 * width >= config.block_size:
            raise ValueError(f"native_context='sliding' keeps cache + call rows within block_size={config.block_size} "
                             "and a call has up to 2 * speculative_width rows: use speculative_width < "
                             f"{config.block_size / 2:g} or native_context='full'.")
        self.threshold = confidence_threshold
        self.stop_at_eos = stop_at_eos
        self.context_length = config.block_size if native_context == "sliding" else None
        self.first_hitting = FirstHittingTimes.from_config(config) if native_cache_order == "first_hitting" else None
        self.times: list[float] = []

    def begin(self, layout, length: int, device: torch.device) -> None:
        super().begin(layout, length, device)
        if self.first_hitting is not None:
            self.times = self.first_hitting.sample(length, device, getattr(self.acceptance, "generator", None))

    def plan(self, window: tuple[int, ...]) -> Plan:
        return Plan(order=tuple(window), verify=False, proposals=(Proposal(0),))

    def advance(self, plan: Plan, result: CallResult) -> Verdict:
        tokens, q = self.acceptance.propose(result.proposals[0])
        probs = confidence_of(tokens, q, result.proposals[0])
        commit = probs >= self.threshold
        commit[probs.argmax()] = True
        flags, values = torch.stack([commit.long(), tokens]).tolist()  # the call's one host sync
        pairs = [(plan.order[r], t) for r, (f, t) in enumerate(zip(flags, values, strict=True)) if f]
        if self.first_hitting is not None:  # latest first-hitting time first; ties keep position order
            pairs.sort(key=lambda pair: -self.times[pair[0]])
        return Verdict([t for _, t in pairs], [j for j, _ in pairs], 0, kind="committed")


SCHEDULES: dict[str, type[Schedule]] = {
    s.name: s for s in (ARSchedule, LinearSSSchedule, QuadraticSSSchedule, PackedSSSchedule, HybridSSSchedule,
                        AutoSchedule)
}
# SetDLM's native decoder needs an any-order model; every other schedule runs on both families.
WINDOW_SCHEDULES: dict[str, type[Schedule]] = {**SCHEDULES, NativeSchedule.name: NativeSchedule}
