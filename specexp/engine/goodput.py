"""`speculator.adaptive: goodput`: each step drafts the k that maximises the batch's expected emitted tokens per
unit of step time.

For a request whose conditional per-position acceptance is alpha_1..alpha_K (alpha_i: the chance draft i is
accepted given drafts 1..i-1 were), a step of depth k emits in expectation (Leviathan et al. 2023, with
per-position rates)

    E(k) = 1 + sum_{i <= k} prod_{j <= i} alpha_j            (E(0) = 1: the target's own token)

and a step of n rows costs

    t(k) = fixed(n) + t_verify(k + 1, n) + t_draft(k, n)

from the engine's step costs measured at start-up (`StepCostTable`: a verify of k + 1 tokens a row, and the draft's
decode phase for k drafts, each timed as the engine runs it, graph replay or eager, at every batch size it pads to;
`fixed` below). The draft's prefill of the tokens just committed runs at every k (it keeps the draft's KV up to
date) and samples draft 1, so k drafts take k - 1 decode steps: t_draft(k, n) = 0 for k <= 1, and for k >= 2 the
fused loop of k - 1 steps timed as one (on a GPU one graph replay of k - 1 steps costs less than k - 1 replays of
one step, which a per-step cost times k - 1 would charge). The step's k is

    argmax_k  sum_r E_r(min(k, c_r)) / t(k)        over k = 0..K, ties to the smaller k,

summed over the step's sampling rows r, where c_r is the drafts row r can still use (tokens left - 1). The draft's
decode loop and the verify are shared by the batch, so this is the k that serves the step's requests best
together; for one request it is that request's own best k, argmax_k E(min(k, c)) / t(k) (`best_depth`). A
mid-prompt chunk (no sampled token) adds nothing to the sum.

The estimator (`AcceptanceEstimate`, one per request): every alpha_j starts at the run's running estimate (itself
starting at the prior `prior_acceptance`, `speculator.goodput_prior_acceptance`, default 0.7, at every position).
After each verification of d drafts with a accepted, the positions it observed move by an exponential moving
average of weight `ema_weight` (`speculator.goodput_ema_weight`, default 0.1): alpha_j <- (1 - w) alpha_j + w x_j
with x_j = 1 for j <= a and x_{a+1} = 0 (if a < d); positions past a + 1 were not observed (conditional on a
rejection) and stay. When all d drafts were accepted, positions past d relax the same way towards alpha_d, so a
request whose k fell can find its way back up. The run's estimate takes the same updates from every request; it
starts again at the prior with every `generate` call (`reset`). k = 0 is not a trap: a step that verifies none of
a request's drafts teaches nothing, so on a step of k = 0 every sampling request that could still draft moves its
estimate by the same weight towards the prior (the run's estimate too); an estimate that fell by chance climbs
back until drafting pays again, and drafts then measure it anew. The weight trades noise for tracking: with one
request at a constant acceptance (0.6 or 0.8) and the step costs of a 1B target with a 100M draft on an H200, a
simulation of 64-token requests loses about 1-2% to the best static k at 0.1 and 2-4% at 0.25, most of it the
noise of the estimate.

The cost table's `fixed_ms` (measured at start-up by `NativeEngine.measure_fixed_ms`, for each k) is what a real
step of n rows at depth k costs beyond its replays t_verify(k + 1, n) + t_draft(k, n): the host's scheduling,
staging and commit, the draft's prefill, and whatever of the replays the host's work does not hide. It is what
makes drafting pay on a pair whose step is bound by the host (without it a tiny pair's table says k = 0 where
k = 4 runs 2.4 times as fast). It is measured per k because it is not the same at every k: on an H200 (Llama-3.2-1B
shapes, batch 1) a step at k = 1 took 1.71 ms where one number for every k, measured at k = 0, gave 1.46 ms, so
goodput ran k = 1 where k = 2 served 12% more tokens a second.

Everything is a function of the verifies in step order and the cost table, so a fixed seed (and table:
`metrics.adaptive_step_costs`) gives the same ks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class GoodputSettings:
    """The estimator's prior (per-position conditional acceptance before any verify) and EMA weight."""

    prior_acceptance: float = 0.7
    ema_weight: float = 0.1


@dataclass
class StepCostTable:
    """Step costs in ms by batch size: verify_ms[size][q - 1] (a verify of q tokens a row, q = 1..K+1),
    draft_ms[size][k] (the draft's decode phase for k drafts, k = 0..K: k - 1 decode steps, 0 for k <= 1) and
    fixed_ms[size] (what a real step costs beyond those replays: the host's work and the draft's prefill; one
    number for every k, or a list by k = 0..K as `NativeEngine.measure_fixed_ms` measures it).
    A batch of n rows costs what the smallest size >= n costs (the largest size's beyond it). A number in place of
    a draft_ms list is the cost of one decode step, each k then charged k - 1 of them."""

    verify_ms: dict[int, list[float]]
    draft_ms: dict[int, list[float]]
    fixed_ms: dict[int, float | list[float]] = field(default_factory=dict)  # by size (a list: by k); missing: 0

    def __post_init__(self) -> None:
        for size, fixed in self.fixed_ms.items():
            if not isinstance(fixed, (int, float)) and len(fixed) != len(self.verify_ms[size]):
                raise ValueError(f"fixed_ms[{size}] has {len(fixed)} depths, verify_ms[{size}] "
                                 f"{len(self.verify_ms[size])}: one number, or one entry per k = 0..K")
        for size, draft in self.draft_ms.items():
            if isinstance(draft, (int, float)):
                self.draft_ms[size] = [max(k - 1, 0) * float(draft) for k in range(len(self.verify_ms[size]))]
            elif len(draft) != len(self.verify_ms[size]):
                raise ValueError(f"draft_ms[{size}] has {len(draft)} depths, verify_ms[{size}] "
                                 f"{len(self.verify_ms[size])}: one entry per k = 0..K in both")

    def size_for(self, num_reqs: int) -> int:
        """The table's batch size that a step of num_reqs rows costs as."""
        sizes = sorted(self.verify_ms)
        return next((s for s in sizes if s >= num_reqs), sizes[-1])

    def step_ms(self, k: int, num_reqs: int) -> float:
        """t(k) = fixed(n) + t_verify(k + 1, n) + t_draft(k, n) in ms at batch size n = num_reqs (the draft's
        prefill, in fixed, samples draft 1)."""
        return self.step_ms_by_k(num_reqs, k)[k]

    def step_ms_by_k(self, num_reqs: int, max_k: int) -> list[float]:
        """[t(0), .., t(max_k)] in ms at batch size num_reqs (the size looked up once)."""
        size = self.size_for(num_reqs)
        fixed, verify, draft = self.fixed_ms.get(size, 0.0), self.verify_ms[size], self.draft_ms[size]
        by_k = [float(fixed)] * (max_k + 1) if isinstance(fixed, (int, float)) else fixed
        return [by_k[k] + verify[k] + draft[k] for k in range(max_k + 1)]

    def to_dict(self) -> dict:
        """JSON-ready: {"verify_ms": {"SIZE": [q=1..]}, "draft_ms": {"SIZE": [k=0..]}, "fixed_ms": {"SIZE": ms or
        [k=0..]}}."""
        return {"verify_ms": {str(s): list(v) for s, v in sorted(self.verify_ms.items())},
                "draft_ms": {str(s): list(v) for s, v in sorted(self.draft_ms.items())},
                "fixed_ms": {str(s): v if isinstance(v, (int, float)) else list(v)
                             for s, v in sorted(self.fixed_ms.items())}}


@dataclass
class AcceptanceEstimate:
    """A running per-position conditional acceptance (alpha_1..alpha_K); `seen`: verifies already folded in."""

    conditional: list[float]
    seen: int = 0

    def update(self, num_drafts: int, num_accepted: int, weight: float) -> None:
        """Fold in one verification of num_drafts drafts, num_accepted of them accepted (the module docstring)."""
        if num_drafts <= 0:
            return
        alpha = self.conditional
        observed = min(num_accepted + 1, num_drafts)
        for j in range(observed):
            x = 1.0 if j < num_accepted else 0.0
            alpha[j] += weight * (x - alpha[j])
        if num_accepted == num_drafts:
            for j in range(num_drafts, len(alpha)):
                alpha[j] += weight * (alpha[num_drafts - 1] - alpha[j])

    def relax(self, prior: float, weight: float) -> None:
        """A step that verified none of this estimate's drafts: every position moves towards the prior."""
        for j, alpha in enumerate(self.conditional):
            self.conditional[j] = alpha + weight * (prior - alpha)


def expected_tokens(conditional: list[float], k: int) -> float:
    """E(k) = 1 + sum_{i <= k} prod_{j <= i} alpha_j: tokens a verify of k drafts emits, bonus included."""
    total, run = 1.0, 1.0
    for alpha in conditional[:k]:
        run *= alpha
        total += run
    return total


def best_depth(conditional: list[float], usable: int, costs: StepCostTable, num_reqs: int, max_k: int) -> int:
    """argmax_{k in 0..max_k} E(min(k, usable)) / t(k) (smallest k on ties): one request's best k in a step of
    num_reqs rows."""
    return best_batch_depth([conditional], [usable], costs.step_ms_by_k(num_reqs, max_k))


def best_batch_depth(conditionals: list[list[float]], usables: list[int], step_ms: list[float]) -> int:
    """argmax_{k in 0..K} sum_r E_r(min(k, usable_r)) / step_ms[k] (smallest k on ties), K = len(step_ms) - 1:
    the k that emits the most expected tokens per ms for R rows with these estimates (each of at least K
    positions) and drafts left. One [R, K] pass in numpy, so a batch of 64 costs the host tens of microseconds."""
    max_k = len(step_ms) - 1
    alpha = np.asarray([c[:max_k] for c in conditionals], dtype=np.float64).reshape(len(conditionals), max_k)
    expected = np.ones((alpha.shape[0], max_k + 1))  # E_r(j), j = 0..K
    np.cumsum(np.cumprod(alpha, axis=1), axis=1, out=expected[:, 1:])
    expected[:, 1:] += 1.0
    depth = np.minimum(np.arange(max_k + 1), np.clip(np.asarray(usables), 0, max_k)[:, None])
    rates = np.take_along_axis(expected, depth, axis=1).sum(axis=0) / np.asarray(step_ms)
    best_k, best_rate = 0, -1.0
    for k, rate in enumerate(rates.tolist()):
        if rate > best_rate * (1 + 1e-9):
            best_k, best_rate = k, rate
    return best_k


@dataclass
class GoodputDepth:
    """The adaptive policy: `step_k(rows)` reads each row's new verifies (`Request.verifies`) into its estimate
    and returns the k that maximises the sampling rows' expected tokens per ms (`best_batch_depth`). The estimates live on the requests
    (`Request.acceptance_estimate`); the run's estimate, the prior of every new request, lives here."""

    max_k: int
    costs: StepCostTable | None  # set before the first step (the engine measures it at start-up)
    settings: GoodputSettings = field(default_factory=GoodputSettings)

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """A new run: the run's estimate starts again at the prior."""
        self.run_estimate = AcceptanceEstimate([self.settings.prior_acceptance] * self.max_k)

    def step_depths(self, num_reqs: int) -> frozenset[int]:
        return frozenset(range(self.max_k + 1))

    def estimate_of(self, request) -> AcceptanceEstimate:
        """The request's estimate with every verify it has had folded in (into the run's estimate too)."""
        estimate = request.acceptance_estimate
        if estimate is None:
            estimate = request.acceptance_estimate = AcceptanceEstimate(list(self.run_estimate.conditional))
        weight = self.settings.ema_weight
        for num_drafts, num_accepted in request.verifies[estimate.seen:]:
            estimate.update(num_drafts, num_accepted, weight)
            self.run_estimate.update(num_drafts, num_accepted, weight)
        estimate.seen = len(request.verifies)
        return estimate

    def step_k(self, rows) -> int:
        estimates, usables, idle = [], [], []
        for row in rows:
            estimate = self.estimate_of(row.request)
            if row.samples:
                request = row.request
                usable = request.max_new_tokens - request.num_output_tokens - 1
                estimates.append(estimate.conditional)
                usables.append(usable)
                if usable > 0:
                    idle.append(estimate)
        if not estimates:
            return 0
        k = best_batch_depth(estimates, usables, self.costs.step_ms_by_k(len(rows), self.max_k))
        if k == 0 and idle:  # nothing of this step will be verified: its estimates learn nothing, and relax
            prior, weight = self.settings.prior_acceptance, self.settings.ema_weight
            for estimate in idle:
                estimate.relax(prior, weight)
            self.run_estimate.relax(prior, weight)
        return k
