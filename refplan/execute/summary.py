"""The schedule digest, and a summary of its parts in fixed words, so a disagreement can be named.

Why: the processes of a call agree on one digest of everything the schedule is derived from
(plans, endpoints, budget, dtypes, rank space, key). When the digests differ, a rejection that
shows only two 64-bit numbers leaves the user to guess which argument one process got wrong (a
process that declared ``torch.float16`` where its peers declared ``torch.bfloat16`` is the common
case: same width, so no buffer check of its own can tell). The digest is therefore the hash of
its parts' hashes, and a process that refuses nothing sends, where a refusing one sends its
reason, a summary of ``SUMMARY_WORDS`` words: each part's digest and, where a part is small
enough to show (the budget's numbers, the dtypes declared, the rank space, the key's first
bytes), its value. Every process builds the rejection from the gathered summaries alone, so all
of them raise the same text, and it names the parts that differ, by value where it can.

Nothing here is on a warm call's path: the summary is computed with the digest (once per batch,
remembered with it), and read only when the digests differ.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ..plan import TransferPlan
from ..requests import TransferEndpoints
from .common import StagingBudget

_SCHEMA = "refplan.execute/4"  # 4: the digest is the hash of its parts' hashes


_SEPARATORS = (",", ":")


# Fields of the summary, by word.
_PLANS, _NAMES, _COUNT, _ENDPOINTS = 0, 1, 2, 3
_BUDGET = 4  # five words: bytes_per_peer, total_bytes, max_chunks, max_rounds, max_work
_DTYPES, _DTYPE_SET, _RANKS, _KEY, _KEY_TEXT, _KEY_LENGTH = 9, 10, 11, 12, 13, 15  # the key's text: two words
_DTYPE_CODES = 16  # ten words: one byte per parameter, the first 80 in sorted order


SUMMARY_WORDS = 26
"""Words of the summary; it travels where a refusing process's reason does (``verdict``: the 26
words its header leaves of the message's fixed size)."""


_CODED = (SUMMARY_WORDS - _DTYPE_CODES) * 8  # parameters whose dtype the summary names one by one


_UNCODED = 255  # the byte of a dtype not in ``_DTYPE_NAMES``


_BUDGET_FIELDS = ("bytes_per_peer", "total_bytes", "max_chunks", "max_rounds", "max_work")


_KEY_BYTES = 16  # of the key's UTF-8 shown; longer keys are shown as that prefix and their length


_DTYPE_NAMES = (
    "float32", "float64", "float16", "bfloat16", "complex32", "complex64", "complex128", "uint8", "int8", "int16",
    "int32", "int64", "bool", "uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
    "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2", "qint8", "quint8", "qint32", "quint4x2", "quint2x4",
    "bits1x8", "bits2x4", "bits4x2", "bits8", "bits16",
    "int1", "int2", "int3", "int4", "int5", "int6", "int7", "uint1", "uint2", "uint3", "uint4", "uint5", "uint6",
    "uint7",
)
"""The dtypes a summary's dtype set can name, bit ``i`` for the ``i``-th (by name, so a torch
without some of them still numbers the rest alike); bit 62 stands for any other value."""


_OTHER_DTYPE = 62


_RANK_CODES = {"global": 1, "group": 2}


def _hash(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "backslashreplace")).digest()


def _word(raw: bytes) -> int:
    return int.from_bytes(raw[:8], "big", signed=True)


def _json(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=_SEPARATORS)


def _number(value: object) -> int:
    """A budget number as a word: itself if it fits 63 bits, else a negative word from its hash,
    so that two numbers too large to show are still told apart (the checks accept any positive
    int for most fields)."""
    if type(value) is int and 0 <= value < 2**63:
        return value
    return -1 - (_word(_hash(repr(value))) & (2**62 - 1))


def _dtype_index(kind: object) -> int | None:
    name = str(kind).removeprefix("torch.")
    return _DTYPE_NAMES.index(name) if name in _DTYPE_NAMES else None


def _dtype_set(kinds: Sequence[object]) -> int:
    bits = 0
    for kind in kinds:
        index = _dtype_index(kind)
        bits |= 1 << (_OTHER_DTYPE if index is None else index)
    return bits


def _dtype_codes(kinds: Sequence[object]) -> list[int]:
    raw = bytes(_UNCODED if (i := _dtype_index(kind)) is None else i for kind in kinds[:_CODED]).ljust(_CODED, b"\0")
    return [int.from_bytes(raw[i : i + 8], "little", signed=True) for i in range(0, _CODED, 8)]


def _dtype_of(words: Sequence[int], index: int) -> str:
    code = int(words[_DTYPE_CODES + index // 8]).to_bytes(8, "little", signed=True)[index % 8]
    return "another dtype" if code >= len(_DTYPE_NAMES) else _DTYPE_NAMES[code]


def schedule_digests(
    plans: Mapping[str, TransferPlan],
    endpoints: TransferEndpoints,
    budget: StagingBudget,
    dtypes: Mapping[str, torch.dtype],
    endpoint_ranks: str = "global",
    key: str | None = None,
) -> tuple[int, tuple[int, ...]]:
    """The schedule digest (a signed 64-bit word) and its summary (``SUMMARY_WORDS`` words).

    Each part is the SHA-256 of its canonical JSON (sorted keys, no whitespace); the digest is the
    SHA-256 of the schema and the parts' hashes, so equal inputs give equal digests in every
    process, any difference in a part changes it, and the parts cost one serialization in all.
    """
    names = sorted(plans)
    kinds = [dtypes.get(name) for name in names]
    parts = {
        "plans": _hash(_json({name: plans[name].to_dict() for name in names})),
        "endpoints": _hash(_json(endpoints.to_dict())),
        "budget": _hash(_json([getattr(budget, f) for f in _BUDGET_FIELDS])),
        "dtypes": _hash(_json({name: str(kind) for name, kind in zip(names, kinds, strict=True)})),
        "endpoint_ranks": _hash(_json(endpoint_ranks)),
        # Absent rather than null, so that a call without a key differs from one keyed "null".
        "key": _hash(_json([] if key is None else [key])),
    }
    whole = hashlib.sha256(_SCHEMA.encode())
    for part in parts.values():
        whole.update(part)
    words = [0] * SUMMARY_WORDS
    words[_PLANS] = _word(parts["plans"])
    words[_NAMES] = _word(_hash(_json(names)))
    words[_COUNT] = len(names)
    words[_ENDPOINTS] = _word(parts["endpoints"])
    for i, f in enumerate(_BUDGET_FIELDS):
        words[_BUDGET + i] = _number(getattr(budget, f))
    words[_DTYPES] = _word(parts["dtypes"])
    words[_DTYPE_SET] = _dtype_set(kinds)
    words[_DTYPE_CODES:] = _dtype_codes(kinds)
    words[_RANKS] = _RANK_CODES.get(endpoint_ranks, _word(parts["endpoint_ranks"]) | 4)
    if key is not None:
        raw = key.encode("utf-8", "backslashreplace")
        words[_KEY] = _word(parts["key"]) | 1  # never 0, which says "no key"
        text = raw[:_KEY_BYTES].ljust(_KEY_BYTES, b"\0")
        words[_KEY_TEXT] = int.from_bytes(text[:8], "little", signed=True)
        words[_KEY_TEXT + 1] = int.from_bytes(text[8:], "little", signed=True)
        words[_KEY_LENGTH] = len(raw)
    return _word(whole.digest()), tuple(words)


def schedule_digest(
    plans: Mapping[str, TransferPlan],
    endpoints: TransferEndpoints,
    budget: StagingBudget,
    dtypes: Mapping[str, torch.dtype],
    endpoint_ranks: str = "global",
    key: str | None = None,
) -> int:
    """A signed 64-bit digest of everything the schedule is derived from (never buffer contents).

    SHA-256 over the SHA-256 of each part's canonical JSON (sorted keys, no whitespace: the plans,
    endpoints, budget, dtypes, rank space and key; ``summary``), so equal inputs give equal
    digests in every process and any difference in a plan, a binding, the budget, a dtype, the
    rank space or the caller's ``key`` changes it. The key tells apart calls whose schedules are
    otherwise the same (weights and gradients of one shape): calls on a group are matched in
    the order each process makes them, so two such syncs issued in different orders would
    otherwise move each other's bytes.
    """
    return schedule_digests(plans, endpoints, budget, dtypes, endpoint_ranks, key)[0]


def _groups(summaries: Sequence[tuple[int, Sequence[int]]], field: slice | int) -> dict[Any, list[int]]:
    out: dict[Any, list[int]] = {}
    for process, words in summaries:
        value = tuple(words[field]) if isinstance(field, slice) else words[field]
        out.setdefault(value, []).append(process)
    return out


def _listed(groups: Mapping[Any, list[int]], show: Callable[[Any], str], between: str = "; ") -> str:
    ordered = sorted(groups.items(), key=lambda item: item[1])
    return between.join(f"{show(value)} on processes {procs}" for value, procs in ordered)


def _hex(word: int) -> str:
    return f"digest {word & (2**64 - 1):#018x}"


def _dtype_text(bits: int) -> str:
    names = [name for i, name in enumerate(_DTYPE_NAMES) if bits >> i & 1]
    if bits >> _OTHER_DTYPE & 1:
        names.append("another dtype")
    return "{" + ", ".join(names) + "}"


def _key_text(words: tuple[int, ...]) -> str:
    flag, first, second, length = words
    if flag == 0:
        return "no key"
    raw = (first.to_bytes(8, "little", signed=True) + second.to_bytes(8, "little", signed=True))[:length]
    shown = raw.decode("utf-8", "replace")
    more = f"... ({length} bytes)" if length > _KEY_BYTES else ""
    return f"{shown!r}{more} ({_hex(flag)})"


def _budget_number(word: int) -> str:
    return f"a number of 2**63 or more ({_hex(word)})" if word < 0 else str(word)


def _ranks_text(code: int) -> str:
    names = {v: k for k, v in _RANK_CODES.items()}
    return repr(names[code]) if code in names else f"another value ({_hex(code)})"


def _names_text(words: tuple[int, ...]) -> str:
    return f"{words[1]} parameters ({_hex(words[0])})"


def disagreement(summaries: Sequence[tuple[int, Sequence[int]]], names: Sequence[str] = ()) -> str:
    """Which parts of the schedule differ among ``summaries`` (process, summary words), by value
    where the summary holds it; "" if the summaries show no difference (then only the digests
    can be reported). ``names`` are this process's parameter names, sorted: where every process
    has the same names (their digest agrees), a dtype that differs is named by its parameter.
    Built from the gathered words (and names every process shares), so every process writes the
    same text."""
    differ: list[str] = []
    agree: list[str] = []

    def part(label: str, field: slice | int, show: Callable[[Any], str]) -> None:
        groups = _groups(summaries, field)
        if len(groups) > 1:
            differ.append(f"{label} differ ({_listed(groups, show)})")
        else:
            agree.append(label)

    same_names = len(_groups(summaries, slice(_NAMES, _COUNT + 1))) == 1
    if not same_names:
        part("the parameter names", slice(_NAMES, _COUNT + 1), _names_text)
    else:
        part("the plans", _PLANS, _hex)
    part("the endpoints", _ENDPOINTS, _hex)
    budgets = [f"{f} is {_listed(groups, _budget_number, ', ')}" for i, f in enumerate(_BUDGET_FIELDS)
               if len(groups := _groups(summaries, _BUDGET + i)) > 1]
    if budgets:
        differ.append(f"the budgets differ ({'; '.join(budgets)})")
    else:
        agree.append("the budgets")
    if same_names and len(_groups(summaries, _DTYPES)) > 1:
        differ.append(_dtypes_differ(summaries, names))
    elif not same_names and len(_groups(summaries, _DTYPE_SET)) > 1:
        # Keyed by parameter, the dtypes' digests differ with the names: only the sets can say more.
        part("the dtypes", _DTYPE_SET, _dtype_text)
    else:
        agree.append("the dtypes")
    part("the endpoint_ranks", _RANKS, _ranks_text)
    part("the keys", slice(_KEY, _KEY_LENGTH + 1), _key_text)
    if not differ:
        return ""
    return "; ".join(differ) + (f"; {', '.join(agree)} agree" if agree else "")


def _dtypes_differ(summaries: Sequence[tuple[int, Sequence[int]]], names: Sequence[str]) -> str:
    """The parameters whose dtypes differ (the first three, among the first ``_CODED``), else the
    sets of dtypes declared, else only that they differ (past those, or as unnamed dtypes)."""
    shown = []
    for index, name in enumerate(names[:_CODED]):
        groups: dict[str, list[int]] = {}
        for process, words in summaries:
            groups.setdefault(_dtype_of(words, index), []).append(process)
        if len(groups) > 1:
            shown.append(f"{name!r} is {_listed(groups, str, ', ')}")
        if len(shown) == 3:
            break
    if shown:
        return f"the dtypes differ ({'; '.join(shown)})"
    sets = _groups(summaries, _DTYPE_SET)
    if len(sets) > 1:
        return f"the dtypes differ ({_listed(sets, _dtype_text)})"
    (bits,) = sets
    return (f"the dtypes differ (every process declares {_dtype_text(bits)}; they differ for parameters past the "
            f"first {_CODED} or as dtypes the summary cannot name: {_listed(_groups(summaries, _DTYPES), _hex)})")
