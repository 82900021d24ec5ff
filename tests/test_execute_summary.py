"""The schedule summary (``refplan.execute.summary``): what a digest disagreement can name.

The two-process runs (``test_execute_outcome``) show the rejection end to end; these check the
summary's words and its text on inputs no small run reaches: more parameters than it names one
by one, a long key, a dtype it has no name for, an odd rank space, and summaries that agree.
"""

from __future__ import annotations

import torch

from refplan import TransferEndpoints, contiguous_split_map
from refplan.execute import StagingBudget, schedule_digest
from refplan.execute.summary import _CODED, SUMMARY_WORDS, disagreement, schedule_digests
from refplan.planner import plan_transfers

ROWS = contiguous_split_map((4, 2), [2, 2], 0)
ENDS = TransferEndpoints({0: 0, 1: 1}, {0: 1, 1: 0})


def _plans(n: int) -> dict[str, object]:
    return plan_transfers({f"p{i:03d}": (ROWS, ROWS) for i in range(n)}, endpoints=ENDS, element_size=2)


def _summary(n: int, dtypes: dict[str, torch.dtype], **kwargs: object) -> tuple[int, tuple[int, ...]]:
    return schedule_digests(_plans(n), ENDS, kwargs.pop("budget", StagingBudget()), dtypes, **kwargs)  # type: ignore[arg-type]


def test_the_summary_fills_the_verdicts_room_and_the_digest_is_the_public_one() -> None:
    from refplan.execute import verdict

    dtypes = {f"p{i:03d}": torch.bfloat16 for i in range(3)}
    digest, words = _summary(3, dtypes)
    assert len(words) == SUMMARY_WORDS == verdict._HELLO_WORDS - verdict._HEADER_WORDS
    assert digest == schedule_digest(_plans(3), ENDS, StagingBudget(), dtypes)  # type: ignore[arg-type]
    assert all(-(2**63) <= w < 2**63 for w in words)  # each travels as one int64
    assert disagreement([(0, words), (1, words)]) == ""


def test_a_dtype_past_the_named_parameters_is_told_by_its_set_or_by_parameter() -> None:
    n = _CODED + 5
    names = sorted(f"p{i:03d}" for i in range(n))
    base = dict.fromkeys(names, torch.bfloat16)
    late = {**base, names[-1]: torch.float16}  # past the parameters named one by one: named by its set
    _, a = _summary(n, base)
    _, b = _summary(n, late)
    text = disagreement([(0, a), (1, b)], names)
    assert "the dtypes differ ({bfloat16} on processes [0]; {float16, bfloat16} on processes [1])" in text, text
    swapped = {**late, names[-2]: torch.float16, names[-1]: torch.bfloat16}
    _, c = _summary(n, swapped)
    text = disagreement([(0, b), (1, c)], names)
    assert ("the dtypes differ (every process declares {float16, bfloat16}; they differ for parameters past the "
            f"first {_CODED}") in text, text
    early = {**base, names[1]: torch.float8_e4m3fn, names[2]: torch.float32, names[3]: torch.int8, names[4]: torch.int8}
    _, d = _summary(n, early)
    text = disagreement([(0, a), (1, d)], names)
    assert ("'p001' is bfloat16 on processes [0], float8_e4m3fn on processes [1]; 'p002' is bfloat16 on processes "
            "[0], float32 on processes [1]; 'p003' is") in text, text
    assert "'p004'" not in text, text  # the first three are named


def test_keys_ranks_and_dtypes_it_cannot_name_are_still_told_apart() -> None:
    dtypes = {"p000": torch.bfloat16}
    long = "weights-of-the-policy-model-step-0001"
    _, a = _summary(1, dtypes, key=long)
    _, b = _summary(1, dtypes, key=long[:-1] + "2")  # the same first 16 bytes
    text = disagreement([(0, a), (1, b)], ["p000"])
    assert text.startswith("the keys differ ('weights-of-the-p'... (37 bytes) (digest 0x"), text
    assert "the plans, the endpoints, the budgets, the dtypes, the endpoint_ranks agree" in text, text
    _, c = _summary(1, dtypes, endpoint_ranks="local")
    _, d = _summary(1, dtypes)
    assert "the endpoint_ranks differ ('global' on processes [0]; another value (digest 0x" in disagreement(
        [(0, d), (1, c)], ["p000"]
    )
    _, e = _summary(1, {"p000": torch.float64})
    _, f = _summary(1, {"p000": "half"})  # type: ignore[dict-item]  # not a dtype: "another dtype"
    assert "the dtypes differ ('p000' is float64 on processes [0], another dtype on processes [1])" in disagreement(
        [(0, e), (1, f)], ["p000"]
    )


def test_different_parameter_names_are_not_read_as_dtypes_of_the_same_parameters() -> None:
    _, a = _summary(2, {"p000": torch.bfloat16, "p001": torch.bfloat16})
    _, b = _summary(3, {"p000": torch.bfloat16, "p001": torch.bfloat16, "p002": torch.float16})
    text = disagreement([(0, a), (1, b)], ["p000", "p001"])
    assert text.startswith("the parameter names differ (2 parameters (digest 0x"), text
    assert "3 parameters" in text and "'p00" not in text, text


def test_numbers_too_large_to_show_dtypes_it_had_no_name_for_and_odd_keys_are_told_apart() -> None:
    """From a review of this change: budgets of 2**64 and 2**65 read as agreeing (both -1), so the
    text said "the budgets ... agree"; int1 against int2 read as "not for the same parameters";
    a key's trailing NUL bytes were hidden."""
    dtypes = {"p000": torch.bfloat16}
    _, a = _summary(1, dtypes, budget=StagingBudget(bytes_per_peer=2**64))
    _, b = _summary(1, dtypes, budget=StagingBudget(bytes_per_peer=2**65))
    text = disagreement([(0, a), (1, b)], ["p000"])
    assert text.startswith("the budgets differ (bytes_per_peer is a number of 2**63 or more (digest 0x"), text
    assert text.count("a number of 2**63 or more") == 2 and "the budgets" not in text.split("; ")[-1], text
    _, c = _summary(1, {"p000": torch.int1})
    _, d = _summary(1, {"p000": torch.int2})
    assert disagreement([(0, c), (1, d)], ["p000"]).startswith(
        "the dtypes differ ('p000' is int1 on processes [0], int2 on processes [1])"
    )
    _, e = _summary(1, dtypes, key="a\0")
    _, f = _summary(1, dtypes, key="a")
    text = disagreement([(0, e), (1, f)], ["p000"])
    assert "the keys differ ('a\\x00' (digest" in text and "'a' (digest" in text, text


def test_different_names_are_not_also_reported_as_dtypes_that_differ() -> None:
    _, a = _summary(2, {"p000": torch.bfloat16, "p001": torch.bfloat16})
    plans = plan_transfers({"p000": (ROWS, ROWS), "q": (ROWS, ROWS)}, endpoints=ENDS, element_size=2)
    _, b = schedule_digests(plans, ENDS, StagingBudget(), {"p000": torch.bfloat16, "q": torch.bfloat16})
    text = disagreement([(0, a), (1, b)], ["p000", "p001"])
    assert text.startswith("the parameter names differ (2 parameters (digest 0x"), text
    assert "dtypes differ" not in text and "the dtypes" in text.split("; ")[-1], text
    _, c = schedule_digests(plans, ENDS, StagingBudget(), {"p000": torch.bfloat16, "q": torch.float16})
    text = disagreement([(0, a), (1, c)], ["p000", "p001"])
    assert "the dtypes differ ({bfloat16} on processes [0]; {float16, bfloat16} on processes [1])" in text, text


def test_a_reason_cut_to_the_verdicts_room_says_so() -> None:
    """A refusal's reason travels in the 208 bytes the header leaves; one cut there read "131072
    network chunks, at least ; process 1: ..." with nothing to show that it was cut."""
    from refplan.execute import verdict

    room = verdict._REASON_BYTES
    for reason in ("short reason", "x" * room, "y" * (room + 1), "é" * room):
        back = verdict._decode_reason(verdict._encode_reason(reason))
        if len(reason.encode()) <= room:
            assert back == reason
        else:
            assert back.endswith("…") and reason.startswith(back[:-1]) and len(back.encode()) <= room, back
