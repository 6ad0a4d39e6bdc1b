"""Any-order decoding (paper appendix C, Algorithm 3) over an active window of unresolved positions.

The runner hands each call the window U_t (up to W unresolved positions starting at the leftmost one);
a schedule picks the order pi_t from scores known before the call, verifies its stored draft in that
order with a same-position verifier, and keeps the proposals for positions that stay unresolved.
Drafts are keyed by output position, so an order never moves a draft token. A call's accepted
tokens come back as ``(position, token)`` pairs in rank order together with h, the number of them
that were draft tokens (their rows enter the cache in this call; the last pair of a partial match is
the verifier's correction, processed as an input by the next call).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..acceptance import Acceptance, Greedy, ProposalDistribution, probabilities
from ..order import ORDERS
from ..plan import CallResult, WindowPlan
from .packed_ss import DEFAULT_BRANCHES, HYBRID, check_branches

Accepted = list[tuple[int, int]]


def _confidence(tokens: torch.Tensor, q: ProposalDistribution | None, logits: torch.Tensor) -> torch.Tensor:
    """The probability the drafter gave each proposed token (its stored Q when sampling)."""
    return q.prob(tokens) if q is not None else probabilities(logits).gather(-1, tokens[:, None])[:, 0]


class WindowSchedule:
    """Shared state: draft tokens, the Q they were drawn from, and a confidence score per position."""

    name = ""
    speculative = True  # as `Schedule`: whether it drafts, whether its output is the AR mode's, the generate
    exact = True  # options it takes besides speculative_width and verify_order, whether it verifies at all
    options: tuple[str, ...] = ()
    verifies = True
    default_width_cap: int | None = None
    stop_at_eos = True  # an accepted EOS at j sets E = min(E, j)
    context_length: int | None = None  # keep cache + call rows <= this by dropping the oldest cache rows

    def __init__(self, width: int, acceptance: Acceptance | None = None, verify_order: str = "ltr"):
        self.width = width
        self.acceptance = acceptance or Greedy()
        self.order = ORDERS[verify_order]
        self.scores_order = verify_order != "ltr"  # LTR ignores scores: skip their softmax on every call
        self.draft: dict[int, int] = {}  # D_{t-1}: position -> token
        self.q: ProposalDistribution | None = None  # Q of the proposal call the draft came from
        self.q_row: dict[int, int] = {}  # position -> row of `q`
        self.score: dict[int, float] = {}  # appendix E.6 confidence score per position

    def begin(self, length: int, device: torch.device) -> None:
        """Called once before the first call with the number of output positions."""

    def plan(self, window: list[int]) -> WindowPlan:
        raise NotImplementedError

    def advance(self, plan: WindowPlan, result: CallResult) -> tuple[Accepted, int] | None:
        raise NotImplementedError

    def _stored(self, order: tuple[int, ...]) -> tuple[int | None, ...]:
        return tuple(self.draft.get(j) for j in order)

    def _verify(self, plan: WindowPlan, result: CallResult) -> tuple[Accepted, int]:
        """Algorithm 3, lines 7 and 9-10: check the available draft prefix in rank order; A_t = min(h+1, u)."""
        k = plan.available
        draft = torch.tensor([plan.draft[r] for r in range(k)], dtype=torch.long)
        q = None if self.q is None else self.q[[self.q_row[j] for j in plan.order[:k]]]
        logits = result.verifier[: min(k + 1, len(plan.order))]
        accepted, h = self.acceptance.verify(draft.to(logits.device), q, logits)
        return list(zip(plan.order, accepted.tolist(), strict=False)), h

    def _draft_from(self, positions: list[int], logits: torch.Tensor, scored: bool = True) -> None:
        """Algorithm 3, line 15: the proposals at positions still unresolved become D_t."""
        if not positions:  # the whole window was accepted
            self.draft, self.q, self.q_row = {}, None, {}
            self.score = {} if scored else self.score
            return
        tokens, q = self.acceptance.propose(logits)
        self.draft = dict(zip(positions, tokens.tolist(), strict=True))
        self.q, self.q_row = q, {j: i for i, j in enumerate(positions)}
        if scored and self.scores_order:  # E.6: the probability the drafter gave its token when proposing it
            self.score = dict(zip(positions, _confidence(tokens, q, logits).tolist(), strict=True))


class WindowARSchedule(WindowSchedule):
    """AR decoding on a same-position model: one verifier MASK at the leftmost unresolved position."""

    name = "ar"
    speculative = False

    def plan(self, window: list[int]) -> WindowPlan:
        return WindowPlan(order=tuple(window[:1]))

    def advance(self, plan: WindowPlan, result: CallResult) -> tuple[Accepted, int]:
        return self._verify(plan, result)


class WindowPackedSSSchedule(WindowSchedule):
    """Algorithm 3: verify D_{t-1} in order pi_t and draft every position of U_t from P_{t-1}, in one call."""

    name = "packed_ss"

    def regions(self, u: int) -> tuple[int, ...]:
        return (0,)

    def plan(self, window: list[int]) -> WindowPlan:
        order = self.order(window, self.score)
        return WindowPlan(order=order, draft=self._stored(order), regions=self.regions(len(order)))

    def advance(self, plan: WindowPlan, result: CallResult) -> tuple[Accepted, int]:
        accepted, h = self._verify(plan, result)
        # Region b drafted from P_{t-1} plus the drafts at ranks < b: take the largest b <= h.
        g = max(i for i, b in enumerate(plan.regions) if b <= h)
        rest = list(range(len(accepted), len(plan.order)))
        first = plan.region_ranks(plan.regions[g]).start  # row i of region g is rank first + i
        self._draft_from([plan.order[r] for r in rest], result.proposals[g][[r - first for r in rest]])
        return accepted, h


class WindowQuadraticSSSchedule(WindowPackedSSSchedule):
    """One proposal region per acceptance count h = 0..u-1, following pi_t: p + 2u + u^2 rows in
    appendix D.3's static form, p + 2u + u(u - 1) / 2 once the rows no acceptance can use are dropped."""

    name = "quadratic_ss"

    def regions(self, u: int) -> tuple[int, ...]:
        return tuple(range(u))


class WindowHybridSSSchedule(WindowPackedSSSchedule):
    """The k-branch hybrid on a window: R regions b = 0..min(k, u) - 1, region b drafted from P_{t-1} plus the
    drafts at ranks < b (following pi_t); after h acceptances region min(h, k - 1) supplies the next draft.

    The SetDLM layout has one region form, so the endpoints hold exactly: k = 1 is Packed-SS's ``(0,)`` and any
    k >= u (in particular k = W + 1, the prefix family's full set, clipped to the window) is Quadratic-SS's
    ``0..u-1``: the same calls, rows and acceptances. By default a call has p + d + min(kappa + 1, u) rows plus
    u - 1 - b rows per region b (`WindowPlan.region_ranks`), so each region past Packed-SS's costs fewer rows."""

    name = HYBRID
    options = ("speculative_branches",)

    def __init__(self, width: int, acceptance: Acceptance | None = None, verify_order: str = "ltr",
                 speculative_branches: int = DEFAULT_BRANCHES):
        super().__init__(width, acceptance, verify_order)
        self.speculative_branches = check_branches(speculative_branches, width)

    def regions(self, u: int) -> tuple[int, ...]:
        return tuple(range(min(self.speculative_branches, u)))


class WindowLinearSSSchedule(WindowSchedule):
    """Drafting call [N | R] from the newest prefix, then verification call [O | M]: p + 3u rows.

    Its confidence score is the verifier's top probability at each position in the previous
    iteration (appendix E.6); the order is fixed before the drafting call."""

    name = "linear_ss"

    def __init__(self, width: int, acceptance: Acceptance | None = None, verify_order: str = "ltr"):
        super().__init__(width, acceptance, verify_order)
        self.pending_order: tuple[int, ...] | None = None

    def plan(self, window: list[int]) -> WindowPlan:
        if self.pending_order is None:
            return WindowPlan(order=self.order(window, self.score), verify=False, regions=(0,))
        return WindowPlan(order=self.pending_order, draft=self._stored(self.pending_order))

    def advance(self, plan: WindowPlan, result: CallResult) -> tuple[Accepted, int] | None:
        if not plan.verify:
            self._draft_from(list(plan.order), result.proposals[0], scored=False)
            self.pending_order = plan.order
            return None
        accepted, h = self._verify(plan, result)
        if self.scores_order:
            top = probabilities(result.verifier).max(dim=-1).values.tolist()
            self.score = dict(zip(plan.order, top, strict=True))
        self.draft, self.q, self.pending_order = {}, None, None
        return accepted, h


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


class NativeSchedule(WindowSchedule):
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

    def begin(self, length: int, device: torch.device) -> None:
        if self.first_hitting is not None:
            self.times = self.first_hitting.sample(length, device, getattr(self.acceptance, "generator", None))

    def plan(self, window: list[int]) -> WindowPlan:
        return WindowPlan(order=tuple(window), verify=False, regions=(0,))

    def advance(self, plan: WindowPlan, result: CallResult) -> tuple[Accepted, int]:
        tokens, q = self.acceptance.propose(result.proposals[0])
        probs = _confidence(tokens, q, result.proposals[0])
        commit = probs >= self.threshold
        commit[probs.argmax()] = True
        pairs = [(plan.order[r], int(tokens[r])) for r in commit.nonzero()[:, 0].tolist()]
        if self.first_hitting is not None:  # latest first-hitting time first; ties keep position order
            pairs.sort(key=lambda pair: -self.times[pair[0]])
        return pairs, 0


WINDOW_SCHEDULES: dict[str, type[WindowSchedule]] = {
    s.name: s for s in (WindowARSchedule, WindowLinearSSSchedule, WindowQuadraticSSSchedule, WindowPackedSSSchedule,
                        WindowHybridSSSchedule, NativeSchedule)
}
