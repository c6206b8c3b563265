"""Deterministic inputs from (case, seed).

Every tensor is drawn on the CPU from a `torch.Generator` seeded by the case seed and a stream name, then moved
to the device, so a case produces bit-identical inputs on every machine (replays reproduce). Magnitudes are chosen
so outputs are O(1) and never all zero. Routing patterns: random, skewed (Zipf), one_expert, some_empty, ties (for
grouped routing also tied and near-tied groups), nonfinite (NaN/Inf rows and rows with masked -Inf experts; only for
properties that test them; params["values"] = "every_kind": each kind of row in turn), extreme (logits past exp's
overflow and at the dtype's largest finite value). Boundary values of other ops:
`edge_rows` (zero rows and groups, amax outliers), per-expert counts at block multiples (`near_multiples`,
`counts_to_rows`, `ids_for_counts`) and an expert map whose local experts are a contiguous range (`contiguous_map`).
"""

from __future__ import annotations

import hashlib
import math

import torch

from harness.core import layouts
from harness.core.case import Case


def generator(case: Case, stream: str) -> torch.Generator:
    """A CPU generator for one named input stream of a case (streams are independent of each other)."""
    h = int.from_bytes(hashlib.sha256(f"{case.seed}:{stream}".encode()).digest()[:8], "little")
    return torch.Generator().manual_seed(h & ((1 << 63) - 1))


#: a tensor of more elements than this, for a GPU, is drawn there (a generator on the device): drawing 2**31
#: values on the CPU and copying them took longer than the case (`harness.ops.large`); the values differ from
#: the CPU's draw, but a case this large is only ever built on a GPU
DEVICE_DRAWN_ABOVE = 1 << 28


def device_drawn(shape: tuple[int, ...], device: str) -> bool:
    """Whether a tensor of `shape` for `device` is drawn there (`DEVICE_DRAWN_ABOVE`), not on the CPU."""
    return device != "cpu" and math.prod(shape) > DEVICE_DRAWN_ABOVE


def _drawn(case: Case, stream: str, shape: tuple[int, ...], device: str, draw: str) -> torch.Tensor:
    """`torch.randn` or `torch.rand` (`draw`) of `shape` in float32 from the case's stream: on the CPU, or on
    `device` where the tensor is that large (`device_drawn`)."""
    where = device if device_drawn(shape, device) else "cpu"
    g = generator(case, stream)
    if where != "cpu":
        g = torch.Generator(device=where).manual_seed(g.initial_seed())
    return getattr(torch, draw)(shape, generator=g, dtype=torch.float32, device=where)


def has_extremes(x: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether x holds `dtype`'s largest finite value, its negation and its smallest normal."""
    info = torch.finfo(dtype)
    v = x.detach().float()
    return all(bool((v == t).any()) for t in (info.max, -info.max, info.tiny))


def maybe_strided(case: Case, t: torch.Tensor) -> torch.Tensor:
    """Apply the case's layout flags: `non_contiguous` gives a view with a padded row stride (same values)."""
    if not case.layout.get("non_contiguous") or t.dim() < 2 or t.numel() == 0:
        return t
    pad = 8
    big = torch.zeros(*t.shape[:-1], t.shape[-1] + pad, dtype=t.dtype, device=t.device)
    big[..., : t.shape[-1]] = t
    return big[..., : t.shape[-1]]


def in_layout(case: Case, name: str, t: torch.Tensor) -> torch.Tensor:
    """Input `name` in the layout class the case gives it (`case.layout[name]`, harness.core.layouts: same values,
    gaps of its buffer NaN); a case that names none: as `maybe_strided` leaves it."""
    if name in case.layout:
        return layouts.laid_out(t, layouts.of(case.layout, name))
    return maybe_strided(case, t)


def normal(case: Case, stream: str, shape: tuple[int, ...], device: str, *, scale: float = 1.0) -> torch.Tensor:
    """Standard normal values times `scale`, float32: drawn on the CPU, or on `device` (and left there) where the
    tensor is that large (`DEVICE_DRAWN_ABOVE`)."""
    return _drawn(case, stream, shape, device, "randn") * scale


def randn(case: Case, stream: str, shape: tuple[int, ...], dtype: torch.dtype, device: str,
          *, scale: float = 1.0) -> torch.Tensor:
    t = normal(case, stream, shape, device, scale=scale)
    return maybe_strided(case, t.to(dtype).to(device))


def uniform(case: Case, stream: str, shape: tuple[int, ...], lo: float, hi: float, device: str) -> torch.Tensor:
    t = _drawn(case, stream, shape, device, "rand")
    return (lo + (hi - lo) * t).to(device)


def weights(case: Case, stream: str, shape: tuple[int, ...], dtype: torch.dtype, device: str) -> torch.Tensor:
    """Weights [..., out, in] with realistic magnitude: N(0, 1/fan_in), so a matmul keeps O(1) activations."""
    fan_in = shape[-1]
    return randn(case, stream, shape, dtype, device, scale=1.0 / math.sqrt(max(fan_in, 1)))


def _zipf(num: int, g: torch.Generator, a: float = 1.2) -> torch.Tensor:
    ranks = torch.randperm(num, generator=g).to(torch.float64) + 1.0
    return ranks.pow(-a)


def _on_device(case: Case, shape: tuple[int, ...], device: str) -> bool:
    """Whether a routing-pattern tensor of `shape` is drawn on `device`: past `DEVICE_DRAWN_ABOVE` elements with the
    plain `random` pattern (the others draw row by row on the CPU; a large case is grown with `random`)."""
    return case.routing == "random" and device_drawn(shape, device)


def router_logits(case: Case, m: int, e: int, dtype: torch.dtype, device: str, *, k: int = 1) -> torch.Tensor:
    """Router logits [m, e] following the case's routing pattern."""
    if _on_device(case, (m, e), device):
        return (_drawn(case, "logits", (m, e), device, "randn") * 2.0).to(dtype)
    g = generator(case, "logits")
    x = torch.randn((m, e), generator=g, dtype=torch.float32) * 2.0
    pattern = case.routing
    if pattern == "skewed":
        x = x + 3.0 * _zipf(e, g).log().to(torch.float32)
    elif pattern == "one_expert":
        hot = torch.randperm(e, generator=g)[:k]
        x[:, hot] += 50.0
    elif pattern == "some_empty":
        cold = torch.randperm(e, generator=g)[: max(0, e - max(k, e // 2))]
        x[:, cold] -= 50.0
    elif pattern == "ties":
        # few distinct values: many exact ties among the top scores
        x = torch.round(x)
        groups = case.params.get("num_groups", 1)
        if groups > 1 and m > 0:
            x = _tied_groups(x, groups, dtype, g)
    elif pattern == "extreme" and m > 0:
        x = _extreme_logits(x, dtype, g)
    elif pattern == "nonfinite" and m > 0:
        kind = torch.randint(0, 4, (m,), generator=g)
        if case.params.get("values") == "every_kind":  # each kind of row in turn, the masked one first
            kind = torch.arange(m) % 4
        x[kind == 1] = float("nan")
        x[kind == 2, 0] = float("inf")
        x[kind == 3, :] = float("-inf")
        # masked experts: half the finite rows get 1..E-1 logits at -Inf (sometimes fewer than k finite remain)
        masked = (kind == 0) & (torch.rand(m, generator=g) < 0.5)
        masked[0] |= case.params.get("values") == "every_kind"
        count = torch.randint(1, max(e, 2), (m,), generator=g)
        order = torch.rand((m, e), generator=g).argsort(dim=1)
        drop = masked[:, None] & (order < count[:, None]) & (e > 1)
        x[drop] = float("-inf")
    return x.to(dtype).to(device)


#: past exp's overflow in fp32 (exp(88.73) = inf): a softmax without its max subtracted is inf / inf there
EXP_OVERFLOW = 88.73


#: logits whose sigmoid is tiny but a normal fp32 number: e^-80 to e^-45 (2e-35 to 3e-20), below any eps a
#: renormalizing kernel might add to the sum of the chosen weights
TINY_SIGMOID_LOGITS = (-80.0, -45.0)


def _extreme_logits(x: torch.Tensor, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """Rows in turn: shifted far up (every exp(x) overflows, every sigmoid exactly 1.0: all tied), shifted far down
    (every exp(x) underflows, sigmoids saturate to exactly 0), spread wide (+-10^3: sigmoids saturate to 1 and 0),
    one logit at the dtype's largest finite value with the rest ordinary (in the odd ones its negation too), and
    every logit in TINY_SIGMOID_LOGITS (tiny non-zero sigmoids: the chosen ones, which a correction bias picks,
    renormalize to ordinary weights). Every value finite in `dtype`."""
    top = float(torch.finfo(dtype).max)
    # 128 to 384 (bf16, fp16: their spacing there keeps the logits apart), or 2^12 to 2^13.5 (fp32): past 88
    shift = 2.0**13 if dtype == torch.float32 else 2.0**8
    lo, hi = TINY_SIGMOID_LOGITS
    for r in range(x.shape[0]):
        kind = r % 5
        if kind == 4:
            x[r] = lo + (hi - lo) * torch.rand(x.shape[1], generator=g)
        elif kind == 0:
            x[r] = x[r] + shift * float(torch.rand((), generator=g) + 0.5)
        elif kind == 1:
            x[r] = x[r] - shift * float(torch.rand((), generator=g) + 0.5)
        elif kind == 2:
            x[r] = x[r] * 500.0
        else:
            j = torch.randperm(x.shape[1], generator=g)[:2].tolist()
            x[r, j[0]] = top
            if x.shape[1] > 1 and r % 2:
                x[r, j[1]] = -top
    return x


def _tied_groups(x: torch.Tensor, groups: int, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """Grouped routing's ties: per row, one of
    - a copy: one group's logits copied into 1..G-1 other groups (exactly tied group scores, biased ones too when
      the bias is the same in every group);
    - a nudge: as a copy, then one copy's largest logit raised by one ulp of `dtype` (a near tie: within fp32's
      rounding for fp32 logits, a clear difference for bf16/fp16 ones unless the scores saturate);
    - saturation: the two largest logits of 2..G groups set to 8..30, where sigmoid is 1.0 or within an ulp of it
      in fp32 and 1.0 in bf16 (a router that rounds differently keeps another group).
    """
    m, e = x.shape
    per = e // groups
    xg = x.reshape(m, groups, per).clone()
    kind = torch.randint(0, 3, (m,), generator=g)
    saturated = torch.tensor([8.0, 12.0, 16.0, 17.0, 20.0, 30.0])
    for r in range(m):
        order = torch.randperm(groups, generator=g)
        n = int(torch.randint(1, groups, (1,), generator=g))
        if kind[r] == 2:
            for grp in order[: n + 1].tolist():
                top2 = xg[r, grp].argsort(descending=True)[:2]
                xg[r, grp, top2] = saturated[torch.randint(0, len(saturated), (top2.numel(),), generator=g)]
            continue
        xg[r, order[1: n + 1]] = xg[r, order[0]].clone()
        if kind[r] == 1:
            grp, j = int(order[1]), int(xg[r, order[1]].argmax())
            v = float(xg[r, grp, j])
            # the spacing of `dtype` at |v| (exact for a positive step: lands on the next representable value)
            ulp = 2.0 ** math.floor(math.log2(abs(v))) * torch.finfo(dtype).eps if v else torch.finfo(dtype).tiny
            xg[r, grp, j] = v + ulp
    return xg.reshape(m, e)


def topk_ids(case: Case, m: int, e: int, k: int, device: str) -> torch.Tensor:
    """Expert ids [m, k] int32, distinct per row, following the routing pattern (for ops that consume routing)."""
    if k > e:
        raise ValueError(f"k ({k}) must be <= E ({e})")
    g = generator(case, "topk_ids")
    pattern = case.routing
    if m == 0:
        return torch.empty((0, k), dtype=torch.int32, device=device)
    if _on_device(case, (m, e), device):
        return _drawn(case, "topk_ids", (m, e), device, "rand").argsort(dim=1)[:, :k].to(torch.int32).contiguous()
    if pattern == "one_expert":
        ids = torch.randperm(e, generator=g)[:k].expand(m, k)
    elif pattern in ("skewed", "some_empty"):
        w = _zipf(e, g) if pattern == "skewed" else torch.ones(e, dtype=torch.float64)
        if pattern == "some_empty":
            w[torch.randperm(e, generator=g)[: max(0, e - max(k, e // 2))]] = 0.0
        ids = torch.multinomial(w.expand(m, e), k, replacement=False, generator=g)
    else:
        ids = torch.rand((m, e), generator=g).argsort(dim=1)[:, :k]
    return ids.to(torch.int32).contiguous().to(device)


def topk_weights(case: Case, m: int, k: int, device: str) -> torch.Tensor:
    """Router weights [m, k] fp32 in (0.05, 1], rows summing to 1 (as after renormalize)."""
    w = uniform(case, "topk_weights", (m, k), 0.05, 1.0, "cpu")
    return (w / w.sum(dim=1, keepdim=True).clamp_min(1e-12)).to(device)


def zero_weights(case: Case, w: torch.Tensor) -> torch.Tensor:
    """Router weights [m, k] with exact zeros, as saturated sigmoids, masked or padded slots and EP dispatch leave
    them: every third row (the first among them) all zero, every other odd row one slot zero; the last row keeps
    its weights, so the output is never all zero. A copy."""
    w = w.clone()
    g = generator(case, "zero_weights")
    for r in range(w.shape[0] - 1):
        if r % 3 == 0:
            w[r] = 0.0
        elif r % 2:
            w[r, int(torch.randint(0, w.shape[1], (1,), generator=g))] = 0.0
    return w


def has_zero_weights(w: torch.Tensor) -> bool:
    """Whether some row of w [m, k] is all zero and, with k > 1, some other holds a zero beside a non-zero."""
    zero = w.detach().cpu() == 0
    mixed = (zero.any(dim=1) & ~zero.all(dim=1)).any() or w.shape[1] == 1
    return bool(zero.all(dim=1).any() and mixed)


def expert_map(case: Case, e: int, device: str, routed: torch.Tensor | None = None) -> torch.Tensor | None:
    """An expert map (global -> local id or -1) when the case asks for one: `params["local_experts"]` local ids.

    params["map"] = "contiguous": the local experts are a contiguous range (`contiguous_map`), as drawn; otherwise
    random. routed: the routed global ids; when given (and some expert is local) at least one of them is made local,
    by swapping its map entry with a local expert's: a map that excludes every routed expert gives an all-zero output,
    which tests nothing (that is a deliberate boundary case: local_experts = 0).
    """
    n_local = case.params.get("local_experts")
    if n_local is None:
        return None
    if case.params.get("map") == "contiguous":
        m = contiguous_map(e, n_local, device)
        ids = None if routed is None else routed.detach().cpu().long().reshape(-1)
        if ids is not None and n_local > 0 and ids.numel() and not bool((m.cpu()[ids] >= 0).any()):
            # no routed expert local: the range moved to start at a routed one
            m = contiguous_map(e, n_local, device, start=min(int(ids[0]), e - n_local))
        return m
    g = generator(case, "expert_map")
    local = torch.randperm(e, generator=g)[:n_local].sort().values
    m = torch.full((e,), -1, dtype=torch.int32)
    m[local] = torch.arange(n_local, dtype=torch.int32)
    if routed is not None and n_local > 0 and routed.numel() > 0:
        ids = routed.detach().cpu().long().reshape(-1)
        if not bool((m[ids] >= 0).any()):
            first, donor = int(ids[0]), int(local[0])
            m[first], m[donor] = m[donor].clone(), m[first].clone()
    return m.to(device)


# ------------------------------------------------------------------------------------------ boundary values
#: the factor of the amax outlier in `edge_rows`: far above the other values' amax, finite in every input dtype
OUTLIER = 64.0


def edge_rows(case: Case, x: torch.Tensor, segment: int, *, outlier: float = OUTLIER) -> torch.Tensor:
    """x [R, C] with boundary values in its rows: row 0 all zero (a padding row), in every odd row one
    `segment`-wide unit zero (an all-zero group), in every other even row one element times `outlier` (an amax
    outlier); the rest as given. The last row always keeps values (an outlier where it would be zeroed whole), so
    the case never becomes all zeros. A copy."""
    x = x.clone()
    r, c = x.shape
    if r == 0 or c == 0:
        return x
    g = generator(case, "edge_rows")
    seg = max(1, min(segment, c))
    starts = torch.randint(0, max(1, c // seg), (r,), generator=g) * seg
    where = torch.randint(0, c, (r,), generator=g)
    for i in range(r):
        whole = i == 0 or seg == c
        if i == r - 1 and (whole or i % 2 == 0):
            x[i, int(where[i])] *= outlier
        elif i == 0:
            x[i] = 0.0
        elif i % 2:
            x[i, int(starts[i]): int(starts[i]) + seg] = 0.0
        else:
            x[i, int(where[i])] *= outlier
    return x


def has_zero_unit(x: torch.Tensor, segment: int) -> bool:
    """Whether some row of x [R, C] holds an all-zero run of `segment` aligned columns."""
    if x.numel() == 0:
        return False
    seg = max(1, min(segment, x.shape[1]))
    units = x.detach().cpu()[:, : x.shape[1] // seg * seg].reshape(x.shape[0], -1, seg)
    return bool((units == 0).all(dim=2).any())


def near_multiples(blocks: tuple[int, ...]) -> list[int]:
    """Per-expert slot counts at and around exact multiples of each block: b - 1, b, b + 1 and 2b, and 0."""
    found = [0]
    for b in blocks:
        found += [v for v in (b - 1, b, b + 1, 2 * b) if v > 0]
    return sorted(set(found))


def counts_to_rows(counts: list[int], k: int, rows: int = 0) -> tuple[int, list[int]]:
    """(M, counts) such that M * k slots hold exactly these counts, every count at most M (k distinct experts per
    token), M at least `rows`: the slots they leave over go to filler experts appended after them, so every count
    stays as asked."""
    counts = list(counts)
    m = max(max(counts, default=0), -(-sum(counts) // max(k, 1)), 1, rows)
    spare = m * k - sum(counts)
    while spare > 0:
        counts.append(min(spare, m))
        spare -= counts[-1]
    return m, counts


def ids_for_counts(case: Case, counts: list[int], m: int, k: int, device: str) -> torch.Tensor:
    """topk_ids [m, k] in which expert e appears exactly counts[e] times, the k ids of a token distinct (each
    count at most m, sum m * k): the experts' entries in expert order, dealt slot by slot, shuffled by token."""
    if sum(counts) != m * k or max(counts, default=0) > m:
        raise ValueError(f"counts {counts} cannot fill {m} tokens of {k} distinct experts")
    flat = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts, dtype=torch.int64))
    ids = flat.reshape(k, m).T  # an expert's entries are contiguous and at most m long: one per token
    perm = torch.randperm(m, generator=generator(case, "topk_ids"))
    return ids[perm].to(torch.int32).contiguous().to(device)


def contiguous_map(e: int, n_local: int, device: str, start: int | None = None) -> torch.Tensor:
    """An expert map whose local experts are a contiguous global range (an EP rank's share), by default the one in
    the middle: non-local experts on both sides, local 0 and local n_local - 1 at its ends."""
    m = torch.full((e,), -1, dtype=torch.int32)
    start = (e - n_local) // 2 if start is None else start
    m[start: start + n_local] = torch.arange(n_local, dtype=torch.int32)
    return m.to(device)
