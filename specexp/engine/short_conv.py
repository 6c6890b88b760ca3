"""How a step's rows are laid out for the short-conv layers, and which conv-state window each row reads.

The builder turns the scheduler's batch (CPU tensors, batch order) into `ShortConvMetadata`, the input of
`specexp.models.short_conv_ops.short_conv`. Rows are classified **by mask, never by position**:

    spec     num_decode_draft_tokens >= 0    verifies its last token + drafts (1 .. k+1 tokens)
    decode   -1 and exactly 1 token          e.g. a one-token last prompt chunk, or any decode when k = 0
    prefill  -1 and more than 1 token        a prompt chunk
    (empty)  -1 and 0 tokens                 in no group: owns no token, reads and writes no state

A mixed batch, rows in the scheduler's order (any order is fine):

    row                  0        1            2      3        4
    kind                 spec     prefill      decode spec     prefill
    tokens               a0 a1 a2 b0 b1 b2 b3  c0     d0 d1 d2 e0 e1
    flat index           0  1  2  3  4  5  6   7      8  9  10 11 12
    query_start_loc      [0, 3, 7, 8, 11, 13]

A stable argsort of the per-token group key (spec 0 | decode 1 | prefill 2) groups the tokens while
keeping each row's tokens contiguous and the rows in batch order within a group:

    spec_token_indx      [0 1 2 | 8 9 10]               rows 0, 3   spec_query_start_loc      [0, 3, 6]
    non_spec_token_indx  [7 | 3 4 5 6 | 11 12]          rows 2 | 1, 4   non_spec_query_start_loc  [0, 1, 5, 7]
    spec_state_indices_tensor = [slot0, slot3]          num_accepted_tokens = [acc0, acc3]  (same order)
    state_indices_tensor      = [slot2 | slot1, slot4]  = state_indices_tensor_d ++ state_indices_tensor_p
    query_start_loc_d = [0, 1]     query_start_loc_p = [0, 4, 6]  (prefill part, rebased past the decodes)

A batch without spec rows keeps its tokens where they are when they already run [decode | prefill]
(`non_spec_token_indx` None); a batch of spec rows only never permutes (`spec_token_indx` None).

Conv-state windows (W = L_cache, k drafts; a slot keeps S = W-1+k columns):

    spec row, last verify accepted n (bonus included; 1 after a prefill), verifying q <= k+1 tokens:

        col     0    1    2    3    4    5          (W = 4, k = 3, n = 2, q = 4)
        state [ s0 | s1   s2   s3 | s4   s5 ]
                     \\___________/  reads W-1 columns from n-1
        ext   = s1 s2 s3 x0 x1 x2 x3                 out[i] = bias + sum_j w[j] ext[i + j]
        state [ s2   s3   x0   x1   x2   x3 ]        writes ext[1 : W-1+q] at columns [0, W-2+q)

        The next verify, after n' accepted, reads columns n'-1 .. n'+W-3: the W-1 inputs ending at x[n'-1],
        the last accepted one, so rejected inputs are rolled back without a copy.

    decode / prefill row:  reads columns [0, W-1) (zeros without initial state, i.e. num_computed = 0),
                           writes the last W-1 inputs of (window ++ x) back at [0, W-1).

    A request that was ever verified must stay a spec row (drafts >= 0, possibly 0) for every later
    decode: its window sits at column num_accepted - 1, which the non-spec path does not read.

Full CUDA graphs: a captured graph reads fixed addresses, so a pure-spec batch that fits the capture bounds
is written into persistent buffers and padded up to the runner's padded row count:

    spec_state_indices_tensor [s0  s1  s2 | NULL NULL]      padded rows read slot 0 and never write
    num_accepted_tokens       [n0  n1  n2 | 1    1   ]
    spec_query_start_loc      [0   4   8   12 | 12   12]    flat tail: padded rows own no token
    spec_sequence_masks       [T   T   T  | F    F   ]

Prompt-prefill graphs (`engine.cudagraph_prefill_tokens`) replay a lone prompt chunk of q tokens padded to the
graph's N: one non-spec row, on the varlen path, whose few tensors live in their own persistent buffers
(`build_for_prompt_capture` once per graph, `load_prompt_row` before each replay):

    non_spec_query_start_loc  [0, q]        tokens q..N-1 belong to no row: zero outputs, no state written
    state_indices_tensor      [slot]        NULL at capture
    has_initial_states_p      [computed > 0]  chunks after the first read their stored window

Everything is computed from CPU tensors: counts are Python ints and device tensors arrive through
non-blocking host-to-device copies, so building never waits on the device.
"""

from __future__ import annotations

import torch

from specexp.engine.short_conv_buffers import PromptGraphBuffers, PromptRowsGraphBuffers, SpecGraphBuffers, pad_to
from specexp.engine.short_conv_rows import (
    DECODE,
    EMPTY,
    PREFILL,
    SPEC,
    RowGroups,
    check_batch,
    classify_rows,
    grouped_token_order,
    start_offsets,
)
from specexp.models.metadata import NULL_BLOCK_ID, ShortConvMetadata

# Re-exported: the row grouping is part of this module's public face.
__all__ = ["DECODE", "EMPTY", "PREFILL", "SPEC", "RowGroups", "ShortConvMetadataBuilder", "check_batch", "classify_rows",
           "grouped_token_order", "start_offsets"]


class ShortConvMetadataBuilder:
    """Builds `ShortConvMetadata` for one step from the scheduler's CPU tensors (see the module docstring).

    num_spec_tokens: k, the most drafts a spec row verifies (the conv state keeps W-1+k columns).
    use_full_cuda_graph: pure-spec batches within the capture bounds go through persistent buffers.
    Capture bounds (as vLLM): decode_cudagraph_max_bs = min(max_num_seqs, max_capture_size) rows and
    decode_cudagraph_max_tokens = min(max_num_seqs * (k+1), max_capture_size) tokens.
    """

    def __init__(
        self,
        *,
        num_spec_tokens: int,
        use_full_cuda_graph: bool,
        max_num_seqs: int,
        max_capture_size: int | None,
        device: torch.device,
    ) -> None:
        self.num_spec_tokens = num_spec_tokens
        self.spec_query_len = num_spec_tokens + 1
        self.use_full_cuda_graph = use_full_cuda_graph
        self.device = torch.device(device)
        self.decode_cudagraph_max_bs = max_num_seqs
        self.decode_cudagraph_max_tokens = max_num_seqs * self.spec_query_len
        if max_capture_size is not None:
            self.decode_cudagraph_max_bs = min(self.decode_cudagraph_max_bs, max_capture_size)
            self.decode_cudagraph_max_tokens = min(self.decode_cudagraph_max_tokens, max_capture_size)
        self._graph = SpecGraphBuffers(self.decode_cudagraph_max_bs, self.device)
        self._prompt = PromptGraphBuffers(self.device)
        self._prompt_rows: PromptRowsGraphBuffers | None = None  # allocate_prompt_rows
        self._no_rows_int32 = torch.zeros(0, dtype=torch.int32, device=self.device)
        self._no_rows_int64 = torch.zeros(0, dtype=torch.int64, device=self.device)
        # Pinned staging makes the host-to-device copies truly asynchronous.
        self._pin = self.device.type == "cuda" and torch.cuda.is_available()

    # ------------------------------------------------------------------------------------------ public

    @property
    def spec_graph_buffers(self) -> SpecGraphBuffers:
        """The persistent buffers a full graph of a pure-spec batch reads (`SpecGraphBuffers`)."""
        return self._graph

    def build(
        self,
        *,
        query_start_loc_cpu: torch.Tensor,
        num_computed_tokens_cpu: torch.Tensor,
        num_decode_draft_tokens_cpu: torch.Tensor,
        num_accepted_tokens_cpu: torch.Tensor,
        state_indices_cpu: torch.Tensor,
        num_reqs_padded: int | None = None,
        num_tokens_padded: int | None = None,
    ) -> ShortConvMetadata:
        """Metadata of one step.

        query_start_loc_cpu:         int32[R + 1]  token offsets of the rows (batch order).
        num_computed_tokens_cpu:     int32[R]      tokens whose conv input the row's state already holds.
        num_decode_draft_tokens_cpu: int32[R]      -1: non-spec row; >= 0: spec row with that many drafts.
        num_accepted_tokens_cpu:     int32[R]      spec rows: tokens the last verify accepted, bonus
                                                   included (1 after a prefill); other rows: ignored.
        state_indices_cpu:           int32[R]      conv-state slot of each row (>= 1 for rows with tokens).
        num_reqs_padded / num_tokens_padded: the runner's padded batch for a full-graph replay (rows past
                                                   R are padding). Used only by pure-spec batches within
                                                   the capture bounds when full graphs are on.
        """
        return self._build(
            query_start_loc_cpu, num_computed_tokens_cpu, num_decode_draft_tokens_cpu, num_accepted_tokens_cpu,
            state_indices_cpu, num_reqs_padded, num_tokens_padded, check=True, capture=False,
        )

    def build_for_cudagraph_capture(self, *, num_reqs: int, num_tokens: int, query_len: int | None = None
                                    ) -> ShortConvMetadata:
        """A uniform pure-spec batch of `num_reqs` rows of `query_len` tokens (None: k+1; a graph specialised to a
        step of fewer drafts verifies fewer), up to `num_tokens` with padding, in the persistent buffers a replay
        rewrites. Rows read the NULL slot from the farthest window (num_accepted = k+1), so capture touches no
        request's state."""
        query_len = self.spec_query_len if query_len is None else query_len
        if not 1 <= query_len <= self.spec_query_len:
            raise AssertionError(f"a capture row verifies 1..k+1 = 1..{self.spec_query_len} tokens, got {query_len}")
        if not (num_reqs <= self.decode_cudagraph_max_bs and num_tokens <= self.decode_cudagraph_max_tokens):
            raise AssertionError(
                "short-conv full CUDA graphs capture pure-spec batches only within the capture bounds: "
                f"batch size ({num_reqs}) <= {self.decode_cudagraph_max_bs} and "
                f"number of tokens ({num_tokens}) <= {self.decode_cudagraph_max_tokens}"
            )
        if num_reqs * query_len > num_tokens:
            raise AssertionError(
                f"a capture batch of {num_reqs} rows x {query_len} tokens needs "
                f"{num_reqs * query_len} tokens, got {num_tokens}"
            )
        query_lens = torch.full((num_reqs,), query_len, dtype=torch.int32)
        return self._build(
            start_offsets(query_lens),
            num_computed_tokens_cpu=torch.ones(num_reqs, dtype=torch.int32),
            num_decode_draft_tokens_cpu=query_lens - 1,
            num_accepted_tokens_cpu=torch.full((num_reqs,), self.spec_query_len, dtype=torch.int32),
            state_indices_cpu=torch.full((num_reqs,), NULL_BLOCK_ID, dtype=torch.int32),
            num_reqs_padded=num_reqs,
            num_tokens_padded=num_tokens,
            check=False,
            capture=True,
        )

    def build_for_prompt_capture(self, *, num_tokens: int, state_lookahead: int = 0) -> ShortConvMetadata:
        """Metadata of a prompt-prefill graph: one non-spec row padded to `num_tokens` tokens, whose tensors are
        the persistent prompt buffers (`load_prompt_row` rewrites them before each replay). Captured on an inert
        row (all `num_tokens` tokens real, NULL slot, no initial state), so capture touches no request's state.
        state_lookahead: as `ShortConvMetadata.non_spec_state_lookahead` (1 for a draft's prefill region)."""
        if num_tokens < 1:
            raise ValueError(f"a prompt-prefill graph needs num_tokens >= 1, got {num_tokens}")
        self._load_prompt(num_tokens, NULL_BLOCK_ID, 0)
        p = self._prompt
        return ShortConvMetadata(
            num_prefills=1, num_prefill_tokens=num_tokens, num_decodes=0, num_decode_tokens=0, num_spec_decodes=0,
            num_spec_decode_tokens=0, num_actual_tokens=num_tokens, spec_query_len=self.spec_query_len,
            max_prefill_query_len=num_tokens, query_start_loc=p.query_start_loc,
            state_indices_tensor=p.state_indices, non_spec_query_start_loc=p.query_start_loc,
            has_initial_states_p=p.has_initial, state_indices_tensor_p=p.state_indices,
            query_start_loc_p=p.query_start_loc, num_computed_tokens_p=p.num_computed,
            non_spec_token_indx=None, non_spec_state_lookahead=state_lookahead,
        )

    def load_prompt_row(self, *, query_len: int, num_tokens_padded: int, num_computed_tokens: int,
                        state_index: int) -> None:
        """Point the prompt-prefill graphs at one prompt chunk: `query_len` real tokens (of the replayed graph's
        `num_tokens_padded`), `num_computed_tokens` before it (> 0: it reads its stored window), conv slot
        `state_index`. One host-to-device copy; nothing waits on the device."""
        if not 1 <= query_len <= num_tokens_padded:
            raise ValueError(f"a prompt chunk of {query_len} tokens does not fit a prompt graph of "
                             f"{num_tokens_padded} tokens (valid: 1..{num_tokens_padded})")
        if state_index <= NULL_BLOCK_ID or num_computed_tokens < 0:
            raise ValueError(f"a prompt chunk needs a conv slot > NULL_BLOCK_ID ({NULL_BLOCK_ID}) and "
                             f"num_computed_tokens >= 0, got slot {state_index}, {num_computed_tokens} computed")
        self._load_prompt(query_len, state_index, num_computed_tokens)

    def allocate_prompt_rows(self, *, max_rows: int, max_tokens: int) -> None:
        """Make room for the chunk segments of joined mixed-step graphs: up to `max_rows` prompt rows in up to
        `max_tokens` slots (`PromptRowsGraphBuffers`). Call before capturing any of them."""
        self._prompt_rows = PromptRowsGraphBuffers(max_rows, max_tokens, self.device)

    def build_for_prompt_rows_capture(self, *, num_rows: int, row_tokens: int, state_lookahead: int = 0
                                      ) -> ShortConvMetadata:
        """Metadata of a joined graph's chunk segment: `num_rows` non-spec rows of `row_tokens` slots each, laid
        out uniformly and gathered end to end (`load_prompt_rows` rewrites the buffers before each replay).
        Captured on inert rows (every slot real, NULL slots, no initial state). state_lookahead: as
        `ShortConvMetadata.non_spec_state_lookahead` (1 for a draft's prefill regions)."""
        p, num_tokens = self._prompt_rows, num_rows * row_tokens
        if num_rows < 1 or row_tokens < 1 or num_rows > p.max_rows or num_tokens > p.max_tokens:
            raise ValueError(f"{num_rows} prompt rows of {row_tokens} tokens exceed the buffers' "
                             f"{p.max_rows} rows / {p.max_tokens} tokens")
        self._load_prompt_rows([row_tokens] * num_rows, [NULL_BLOCK_ID] * num_rows, [0] * num_rows, row_tokens)
        qsl, slots = p.query_start_loc[: num_rows + 1], p.state_indices[:num_rows]
        return ShortConvMetadata(
            num_prefills=num_rows, num_prefill_tokens=num_tokens, num_decodes=0, num_decode_tokens=0,
            num_spec_decodes=0, num_spec_decode_tokens=0, num_actual_tokens=num_tokens,
            spec_query_len=self.spec_query_len, max_prefill_query_len=row_tokens, query_start_loc=qsl,
            state_indices_tensor=slots, non_spec_query_start_loc=qsl, has_initial_states_p=p.has_initial[:num_rows],
            state_indices_tensor_p=slots, query_start_loc_p=qsl, num_computed_tokens_p=p.num_computed[:num_rows],
            # one row: its real tokens already lead the segment (no gather; the padding after them is no row's)
            non_spec_token_indx=None if num_rows == 1 else p.token_indx[:num_tokens],
            non_spec_state_lookahead=state_lookahead,
        )

    def load_prompt_rows(self, *, query_lens: list[int], num_computed_tokens: list[int], state_indices: list[int],
                         row_tokens: int) -> None:
        """Point the chunk segments of joined graphs at prompt chunks: row r holds query_lens[r] (1..row_tokens)
        real tokens, num_computed_tokens[r] before them, conv slot state_indices[r] (> NULL); rows past them are
        padding. One host-to-device copy; nothing waits on the device."""
        bad = [(q, c, slot) for q, c, slot in zip(query_lens, num_computed_tokens, state_indices, strict=True)
               if not 1 <= q <= row_tokens or c < 0 or slot <= NULL_BLOCK_ID]
        if bad or len(query_lens) > self._prompt_rows.max_rows:
            raise ValueError(f"prompt chunks (tokens, computed, slot) {bad or query_lens} do not fit rows of "
                             f"{row_tokens} tokens (at most {self._prompt_rows.max_rows} rows, slots > NULL)")
        self._load_prompt_rows(query_lens, state_indices, num_computed_tokens, row_tokens)

    # ----------------------------------------------------------------------------------------- helpers

    def _load_prompt(self, query_len: int, state_index: int, num_computed: int) -> None:
        self._upload(self._prompt.buffer, PromptGraphBuffers.payload(query_len, state_index, num_computed))

    def _load_prompt_rows(self, query_lens: list[int], state_indices: list[int], num_computed: list[int],
                          row_tokens: int) -> None:
        self._upload(self._prompt_rows.buffer,
                     self._prompt_rows.payload(query_lens, state_indices, num_computed, row_tokens))

    def _upload(self, buffer: torch.Tensor, payload: bytes) -> None:
        """Rewrite the persistent byte buffer `buffer` with `payload` in one host-to-device copy that does not
        wait on the device (staged in page-locked memory on a GPU)."""
        staged = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        buffer.copy_(staged.pin_memory() if self._pin else staged, non_blocking=True)

    def _h2d(self, t: torch.Tensor) -> torch.Tensor:
        """A device copy of CPU tensor `t` that never aliases the caller's (reusable) CPU buffers."""
        if self.device.type == "cpu":
            return t.clone()
        return (t.pin_memory() if self._pin else t).to(self.device, non_blocking=True)

    def _build(
        self,
        query_start_loc_cpu: torch.Tensor,
        num_computed_tokens_cpu: torch.Tensor,
        num_decode_draft_tokens_cpu: torch.Tensor,
        num_accepted_tokens_cpu: torch.Tensor,
        state_indices_cpu: torch.Tensor,
        num_reqs_padded: int | None,
        num_tokens_padded: int | None,
        *,
        check: bool,
        capture: bool,
    ) -> ShortConvMetadata:
        if check:
            check_batch(query_start_loc_cpu, num_decode_draft_tokens_cpu, num_computed_tokens_cpu,
                        num_accepted_tokens_cpu, state_indices_cpu, num_reqs_padded, num_tokens_padded,
                        self.spec_query_len)
        graph = self._graph_build(query_start_loc_cpu, num_decode_draft_tokens_cpu, num_accepted_tokens_cpu,
                                  state_indices_cpu, num_reqs_padded, num_tokens_padded, capture)
        if graph is not None:
            return graph
        qsl = query_start_loc_cpu.to(torch.int32)
        groups = classify_rows(qsl[1:] - qsl[:-1], num_decode_draft_tokens_cpu)
        num_tokens = int(qsl[-1])
        ql = groups.query_lens
        counts = {
            "num_prefills": groups.prefill_rows.numel(),
            "num_prefill_tokens": int(ql[groups.prefill_rows].sum()),
            "num_decodes": groups.decode_rows.numel(),
            "num_decode_tokens": groups.decode_rows.numel(),
            "num_spec_decodes": groups.spec_rows.numel(),
            "num_spec_decode_tokens": int(ql[groups.spec_rows].sum()),
            "num_actual_tokens": num_tokens,
            # the longest spec row's query: every row's q in a uniform step of fewer than k drafts (k+1: none)
            "spec_query_len": int(ql[groups.spec_rows].max()) if groups.spec_rows.numel() else self.spec_query_len,
            "max_prefill_query_len": int(ql[groups.prefill_rows].max()) if groups.prefill_rows.numel() else 0,
        }
        non_spec = self._non_spec_fields(groups, num_computed_tokens_cpu, state_indices_cpu)
        if counts["num_spec_decodes"] == 0:
            order = grouped_token_order(groups, num_tokens)
            return ShortConvMetadata(
                **counts, query_start_loc=self._h2d(qsl), **non_spec,
                non_spec_token_indx=None if order is None else self._h2d(order),
            )
        if counts["num_decodes"] + counts["num_prefills"] == 0:  # pure spec: the tokens are the batch
            padded = self._graph_rows(counts, qsl.numel() - 1, num_tokens, num_reqs_padded, num_tokens_padded,
                                      capture)
            spec = self._spec_fields(groups, qsl, num_accepted_tokens_cpu, state_indices_cpu, padded)
            return ShortConvMetadata(
                **counts, **spec, **non_spec, spec_token_indx=None,
                non_spec_token_indx=torch.zeros(0, dtype=torch.int64, device=self.device),
            )
        order = grouped_token_order(groups, num_tokens)
        if order is None:  # spec rows already lead: the grouped order is the batch order
            order = torch.arange(num_tokens)
        order = self._h2d(order)
        spec = self._spec_fields(groups, qsl, num_accepted_tokens_cpu, state_indices_cpu, None)
        return ShortConvMetadata(
            **counts, **spec, **non_spec,
            spec_token_indx=order[: counts["num_spec_decode_tokens"]],
            non_spec_token_indx=order[counts["num_spec_decode_tokens"]:],
        )

    def _graph_build(
        self,
        query_start_loc_cpu: torch.Tensor,
        num_decode_draft_tokens_cpu: torch.Tensor,
        num_accepted_tokens_cpu: torch.Tensor,
        state_indices_cpu: torch.Tensor,
        num_reqs_padded: int | None,
        num_tokens_padded: int | None,
        capture: bool,
    ) -> ShortConvMetadata | None:
        """The metadata of a batch whose every row is a spec row, when it goes through the persistent graph
        buffers (else None: the general path builds it). Python lists and one host-to-device copy: this is
        the per-step path of every graph replay, where host time is step time."""
        qsl = query_start_loc_cpu.tolist()
        num_reqs, num_tokens = len(qsl) - 1, qsl[-1]
        counts = {
            "num_prefills": 0, "num_prefill_tokens": 0, "num_decodes": 0, "num_decode_tokens": 0,
            "num_spec_decodes": num_reqs, "num_spec_decode_tokens": num_tokens, "num_actual_tokens": num_tokens,
            "spec_query_len": max((qsl[i + 1] - qsl[i] for i in range(num_reqs)), default=self.spec_query_len),
            "max_prefill_query_len": 0,
        }
        padded = self._graph_rows(counts, num_reqs, num_tokens, num_reqs_padded, num_tokens_padded, capture)
        if (padded is None or num_reqs == 0 or min(num_decode_draft_tokens_cpu.tolist()) < 0
                or any(qsl[i + 1] <= qsl[i] for i in range(num_reqs))):
            return None  # not a graph batch, or a row that is not a spec row (an empty row included)
        g = self._graph
        fields = {"query_start_loc": qsl, "spec_query_start_loc": qsl,  # all rows spec: the same offsets
                  "spec_state_indices_tensor": state_indices_cpu.tolist(),
                  "num_accepted_tokens": num_accepted_tokens_cpu.tolist(), "spec_sequence_masks": [1] * num_reqs}
        self._upload(g.buffer, g.payload(fields, num_reqs))
        return ShortConvMetadata(
            **counts,
            query_start_loc=g.query_start_loc[: padded + 1],
            spec_query_start_loc=g.spec_query_start_loc[: padded + 1],
            spec_state_indices_tensor=g.spec_state_indices[:padded],
            spec_sequence_masks=g.spec_sequence_masks[:padded],
            num_accepted_tokens=g.num_accepted_tokens[:padded],
            state_indices_tensor=self._no_rows_int32,
            spec_token_indx=None,
            non_spec_token_indx=self._no_rows_int64,
        )

    def _graph_rows(
        self,
        counts: dict,
        num_reqs: int,
        num_tokens: int,
        num_reqs_padded: int | None,
        num_tokens_padded: int | None,
        capture: bool,
    ) -> int | None:
        """Padded row count when this pure-spec batch goes through the persistent graph buffers, else None."""
        if num_reqs_padded is None or not (self.use_full_cuda_graph or capture):
            return None
        fits = (
            num_reqs_padded <= self.decode_cudagraph_max_bs
            and counts["num_spec_decode_tokens"] <= self.decode_cudagraph_max_tokens
            and (num_tokens_padded if num_tokens_padded is not None else num_tokens)
            <= self.decode_cudagraph_max_tokens
        )
        return max(num_reqs_padded, num_reqs) if fits else None

    def _spec_fields(
        self,
        groups: RowGroups,
        qsl: torch.Tensor,
        num_accepted_tokens_cpu: torch.Tensor,
        state_indices_cpu: torch.Tensor,
        padded_rows: int | None,
    ) -> dict:
        """Spec-row tensors, aligned with each other in spec-row order; padded into the persistent graph
        buffers when `padded_rows` is given."""
        rows = groups.spec_rows
        fields = {
            "query_start_loc": qsl,
            "spec_query_start_loc": start_offsets(groups.query_lens[rows]),
            "spec_state_indices_tensor": state_indices_cpu[rows].to(torch.int32),
            "spec_sequence_masks": groups.group == SPEC,
            "num_accepted_tokens": num_accepted_tokens_cpu[rows].to(torch.int32),
        }
        if padded_rows is None:
            return {name: self._h2d(t) for name, t in fields.items()}
        # Padded rows own no token (flat query-start tail), read the NULL slot, never write it, and read
        # the window at column 0 (num_accepted 1).
        padding = {"query_start_loc": int(qsl[-1]), "spec_query_start_loc": int(qsl[-1]),
                       "spec_state_indices_tensor": NULL_BLOCK_ID, "spec_sequence_masks": False, "num_accepted_tokens": 1}
        buffers = {
            "query_start_loc": self._graph.query_start_loc, "spec_query_start_loc": self._graph.spec_query_start_loc,
            "spec_state_indices_tensor": self._graph.spec_state_indices,
            "spec_sequence_masks": self._graph.spec_sequence_masks, "num_accepted_tokens": self._graph.num_accepted_tokens,
        }
        out = {}
        for name, t in fields.items():
            length = padded_rows + (1 if name.endswith("query_start_loc") else 0)
            staged = pad_to(t, length, padding[name])
            view = buffers[name][:length]
            view.copy_(staged.pin_memory() if self._pin else staged, non_blocking=True)
            out[name] = view
        return out

    def _non_spec_fields(
        self, groups: RowGroups, num_computed_tokens_cpu: torch.Tensor, state_indices_cpu: torch.Tensor
    ) -> dict:
        """Non-spec-row tensors in [decode | prefill] order; the _d / _p parts are views of the whole,
        present only when their group has rows."""
        rows = groups.non_spec_rows
        num_decodes = groups.decode_rows.numel()
        state_indices = self._h2d(state_indices_cpu[rows].to(torch.int32))
        fields: dict = {"state_indices_tensor": state_indices}
        if rows.numel() == 0:
            return fields
        computed = num_computed_tokens_cpu[rows].to(torch.int32)
        has_initial = self._h2d(computed > 0)
        starts = self._h2d(start_offsets(groups.query_lens[rows]))
        fields["non_spec_query_start_loc"] = starts
        if num_decodes > 0:
            fields.update(
                state_indices_tensor_d=state_indices[:num_decodes],
                has_initial_states_d=has_initial[:num_decodes],
                query_start_loc_d=starts[: num_decodes + 1],
            )
        if groups.prefill_rows.numel() > 0:
            fields.update(
                state_indices_tensor_p=state_indices[num_decodes:],
                has_initial_states_p=has_initial[num_decodes:],
                # Offsets into the prefill tokens alone: each decode row owns exactly one token.
                query_start_loc_p=starts[num_decodes:] - num_decodes,
                num_computed_tokens_p=self._h2d(computed[num_decodes:]),
            )
        return fields
