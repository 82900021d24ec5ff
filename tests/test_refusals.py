"""Refusals: every validation rule (facts §4.4 R0-R32), every adversarial case A1-A22 (§6), the
#8624 double-write counterexample, "no partial plan", and the cases that must be *accepted*.

Each refusal asserts the error class (exactly, via ``type(...) is``, where the contract names one),
the message fragment, and that the message names the parameter and, where one applies, the side,
the location and the piece. Piece indices are positions in the location's piece list (0-based).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from conftest import assert_executes_exactly, piece, pmap, split

from refplan.errors import (
    AffineTransferError,
    InvalidMapError,
    InvalidReplicaPolicyError,
    UnsupportedLayoutError,
)
from refplan.maps import (
    ParamAffineMap,
    contiguous_split_map,
    replicate,
    replicated_map,
    segmented_map,
    sub_param_map,
)
from refplan.plan import PlanBudget, encode_plan
from refplan.planner import plan_transfer, plan_transfers
from refplan.policies import balanced, first_holder
from refplan.requests import ReplicaPart, ReplicaRequest, TransferEndpoints

SIDES = ("source", "target")


def refuse(
    cls: type[Exception],
    fragment: str,
    call: Callable[[], Any],
    *,
    param: str = "param",
    side: str | None = None,
    location: int | None = None,
    piece_index: int | None = None,
    exact_class: bool = True,
) -> str:
    """Assert ``call`` raises ``cls`` with ``fragment`` (a regex) and the required context."""
    with pytest.raises(cls, match=fragment or None) as info:
        call()
    err = info.value
    if exact_class:
        assert type(err) is cls, f"expected exactly {cls.__name__}, got {type(err).__name__}: {err}"
    msg = str(err)
    assert repr(param) in msg, f"message does not name parameter {param!r}: {msg}"
    if side is not None:
        assert side in msg, f"message does not name the {side} side: {msg}"
    if location is not None:
        assert re.search(rf"location {location}\b", msg), f"message does not name location {location}: {msg}"
    if piece_index is not None:
        assert re.search(rf"piece {piece_index}\b", msg), f"message does not name piece {piece_index}: {msg}"
    return msg


def on_side(bad: ParamAffineMap, side: str, other: ParamAffineMap | None = None, **kw: Any) -> Callable[[], Any]:
    """A call planning ``bad`` on ``side`` against a valid ``other`` map (default: one full replica)."""
    good = other if other is not None else replicated_map(bad.logical_shape, 1)
    if side == "source":
        return lambda: plan_transfer(good, bad, **kw)
    return lambda: plan_transfer(bad, good, **kw)


# ---------------------------------------------------------------------------------------------
# R0-R32, one test per rule.


def test_r0_logical_shapes_must_match_a7() -> None:
    # A7: target (8,8) vs source (64,): a reshape is not a transfer.
    refuse(
        InvalidMapError, "describes",
        lambda: plan_transfer(replicated_map((8, 8), 1), replicated_map((64,), 1)),
    )


@pytest.mark.parametrize("side", SIDES)
def test_r1_max_ndim(side: str) -> None:
    bad = replicated_map((4, 4), 1)
    refuse(UnsupportedLayoutError, "max_ndim", on_side(bad, side, limits=PlanBudget(max_ndim=1)))


def test_r1_default_max_ndim_is_8() -> None:
    nine = (1,) * 9
    refuse(UnsupportedLayoutError, "max_ndim", lambda: plan_transfer(replicated_map(nine, 1), replicated_map(nine, 1)))
    eight = (1,) * 7 + (2,)
    plan = plan_transfer(replicated_map(eight, 1), replicated_map(eight, 1))
    assert plan.moved_elements == 2


@pytest.mark.parametrize("side", SIDES)
def test_r2_shard_ndim_a6(side: str) -> None:
    # A6: shard shape (16,) for a (4,4) F.
    bad = pmap((4, 4), {0: (16,)}, {0: [piece((4, 4), 0, (4, 1), 0, (4, 1), [0])]})
    refuse(UnsupportedLayoutError, "number of axes", on_side(bad, side), side=side, location=0)


@pytest.mark.parametrize("side", SIDES)
def test_r3_max_pieces_per_map(side: str) -> None:
    bad = contiguous_split_map((8, 8), [2, 2, 2, 2], 0)
    other = replicated_map((8, 8), 1)
    refuse(
        AffineTransferError, "max_pieces_per_map",
        on_side(bad, side, other, limits=PlanBudget(max_pieces_per_map=3)), side=side,
    )
    # Exactly at the limit is fine.
    on_side(bad, side, other, limits=PlanBudget(max_pieces_per_map=4))()


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("pieces", [{}, {0: []}], ids=["no-entry", "empty-list"])
def test_r4_nonempty_shard_needs_a_piece_a14(side: str, pieces: dict[int, list[Any]]) -> None:
    # A14: shard (4,) with pieces {} or {0: []}.
    bad = pmap((4,), {0: (4,)}, pieces)
    refuse(InvalidMapError, "nonempty shard", on_side(bad, side), side=side, location=0)


@pytest.mark.parametrize("side", SIDES)
def test_r5_pieces_need_a_shard_shape_a9(side: str) -> None:
    # A9: location 7 lists [] but has no shard shape; the rest of the map is valid.
    good = contiguous_split_map((8, 4), [4, 4], 0)
    bad = pmap((8, 4), good.shard_shapes, {**good.pieces_by_rank, 7: []})
    refuse(InvalidMapError, "no shard shape", on_side(bad, side), side=side, location=7)


@pytest.mark.parametrize("side", SIDES)
def test_r6_empty_shard_with_nonempty_piece(side: str) -> None:
    bad = pmap(
        (4, 8),
        {0: (4, 8), 1: (0, 8)},
        {
            0: [piece((4, 8), 0, (8, 1), 0, (8, 1), [0])],
            1: [piece((0, 8), 0, (8, 1), 0, (8, 1), [1]), piece((2, 8), 0, (8, 1), 0, (8, 1), [1])],
        },
    )
    refuse(InvalidMapError, "empty shard", on_side(bad, side), side=side, location=1, piece_index=1)


@pytest.mark.parametrize("side", SIDES)
def test_r6_empty_shard_with_only_empty_pieces_is_skipped(side: str) -> None:
    m = pmap(
        (4, 8),
        {0: (4, 8), 1: (0, 8)},
        {0: [piece((4, 8), 0, (8, 1), 0, (8, 1), [0])], 1: [piece((0, 8), 0, (8, 1), 0, (8, 1), [1])]},
    )
    other = contiguous_split_map((4, 8), [4, 4], 1)
    plan = on_side(m, side, other)()
    target, source = (other, m) if side == "source" else (m, other)
    assert_executes_exactly(plan, target, source)


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize(
    ("shape", "fragment"),
    [((-1, 8), "negative extent"), ((0, -1), "negative extent"), ((-2, -4), "negative extent"),
     ((0, 2**63), "above 2\\*\\*62")],
)
def test_r8_holds_in_an_empty_shard_too(side: str, shape: tuple[int, int], fragment: str) -> None:
    """A piece of an empty shard with a negative extent (or one above 2**62) is refused by R8, as
    in any other shard: R6 skips the location's copies, never its pieces' extents. Found by the
    ``planner`` fuzz harness (F10): a (0, -1) piece at a (0, 4) shard was planned, and the oracle
    called that plan ``invalid_map``. The oracle refuses every case here as well."""
    from refplan.oracle import verify_plan

    bad = pmap(
        (4, 8),
        {0: (4, 8), 1: (0, 8)},
        {0: [piece((4, 8), 0, (8, 1), 0, (8, 1), [0])], 1: [piece(shape, 0, (8, 1), 0, (8, 1), [1])]},
    )
    refuse(InvalidMapError, fragment, on_side(bad, side), side=side, location=1, piece_index=0)
    other = contiguous_split_map((4, 8), [4, 4], 1)
    target, source = (other, bad) if side == "source" else (bad, other)
    verdict = verify_plan(target, source, [])
    assert verdict.status == "invalid_map", verdict


@pytest.mark.parametrize("side", SIDES)
def test_r7_piece_ndim(side: str) -> None:
    bad = pmap(
        (4, 4), {0: (4, 4)},
        {0: [piece((2, 4), 0, (4, 1), 0, (4, 1), [0]), piece((8,), 8, (1,), 8, (1,), [0])]},
    )
    refuse(InvalidMapError, "number of axes", on_side(bad, side), side=side, location=0, piece_index=1)


@pytest.mark.parametrize("side", SIDES)
def test_r8_negative_extent(side: str) -> None:
    # numel (-1)*4 is not 0, and (-1)*(-4) would even be positive: neither may pass as "empty".
    bad = pmap(
        (4, 4), {0: (4, 4)},
        {0: [piece((4, 4), 0, (4, 1), 0, (4, 1), [0]), piece((-1, 4), 0, (4, 1), 0, (4, 1), [0])]},
    )
    refuse(InvalidMapError, "negative extent", on_side(bad, side), side=side, location=0, piece_index=1)
    worse = pmap(
        (4, 4), {0: (4, 4)},
        {0: [piece((2, 4), 0, (4, 1), 0, (4, 1), [0]), piece((-2, -4), 8, (4, 1), 8, (4, 1), [0])]},
    )
    refuse(InvalidMapError, "negative extent", on_side(worse, side), side=side, location=0, piece_index=1)


@pytest.mark.parametrize("side", SIDES)
def test_r9_empty_locations(side: str) -> None:
    bad = pmap((4, 4), {0: (4, 4)}, {0: [piece((4, 4), 0, (4, 1), 0, (4, 1), [])]})
    refuse(InvalidMapError, "names no holder", on_side(bad, side), side=side, location=0, piece_index=0)


@pytest.mark.parametrize("side", SIDES)
def test_r10_scale_a4(side: str) -> None:
    # A4: replicated_map((4,4), 2, scale=0.5) against replicated_map((4,4), 2).
    bad = replicated_map((4, 4), 2, scale=0.5)
    refuse(UnsupportedLayoutError, "scale", on_side(bad, side, replicated_map((4, 4), 2)),
           side=side, location=0, piece_index=0)


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("which", ["source", "dest"])
@pytest.mark.parametrize("length", [1, 3])
def test_r11_stride_vector_length_a12(side: str, which: str, length: int) -> None:
    # A12: piece (2,2) with a length-1 or length-3 stride vector on the source or dest side.
    strides = (2, 1, 1)[:length] if length == 3 else (1,)
    src = strides if which == "source" else (2, 1)
    dst = strides if which == "dest" else (2, 1)
    bad = pmap((2, 2), {0: (2, 2)}, {0: [piece((2, 2), 0, src, 0, dst, [0])]})
    refuse(InvalidMapError, "stride vector length", on_side(bad, side), side=side, location=0, piece_index=0)


@pytest.mark.parametrize("side", SIDES)
def test_r12_empty_pieces_are_skipped_not_checked(side: str) -> None:
    # An empty piece with absurd offsets and wrong (but correctly sized) strides is never checked.
    base = contiguous_split_map((8, 4), [4, 4], 0)
    junk = piece((0, 4), 10**6, (5, 5), 999, (7, 7), [1])
    m = pmap((8, 4), base.shard_shapes, {0: base.pieces_by_rank[0], 1: [junk, *base.pieces_by_rank[1]]})
    other = contiguous_split_map((8, 4), [3, 5], 0)
    plan = on_side(m, side, other)()
    target, source = (other, m) if side == "source" else (m, other)
    assert_executes_exactly(plan, target, source)


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize(
    "src_strides, dst_strides",
    [((1, 8), (8, 1)), ((8, 1), (1, 8)), ((16, 1), (8, 1)), ((8, 1), (8, 2))],
    ids=["source-transpose-a3", "dest-transpose", "source-wrong-row", "dest-wrong-col"],
)
def test_r13_strides_a3(side: str, src_strides: tuple[int, int], dst_strides: tuple[int, int]) -> None:
    # A3: one (8,8) piece with source strides (1,8), a transpose; and its relatives.
    bad = pmap((8, 8), {0: (8, 8)}, {0: [piece((8, 8), 0, src_strides, 0, dst_strides, [0])]})
    refuse(UnsupportedLayoutError, "strides", on_side(bad, side), side=side, location=0, piece_index=0)


@pytest.mark.parametrize("side", SIDES)
def test_r13_size_one_axis_strides_are_free(side: str) -> None:
    # Only axes of size > 1 are checked: a (1,8) row piece may carry any stride on axis 0.
    m = pmap(
        (4, 8), {r: (1, 8) for r in range(4)},
        {r: [piece((1, 8), 8 * r, (123, 1), 0, (77, 1), [r])] for r in range(4)},
    )
    other = contiguous_split_map((4, 8), [4, 4], 1)
    plan = on_side(m, side, other)()
    target, source = (other, m) if side == "source" else (m, other)
    assert_executes_exactly(plan, target, source)


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize(
    "src_off, dst_off", [(64, 0), (0, 16), (-4, 0), (0, -4)],
    ids=["source-past-end", "dest-past-end", "source-negative", "dest-negative"],
)
def test_r14_offset_not_a_coordinate(side: str, src_off: int, dst_off: int) -> None:
    bad = pmap(
        (4, 4), {0: (4, 4)},
        {0: [piece((2, 4), 0, (4, 1), 0, (4, 1), [0]), piece((2, 4), src_off, (4, 1), dst_off, (4, 1), [0])]},
    )
    refuse(InvalidMapError, "not a coordinate", on_side(bad, side), side=side, location=0, piece_index=1)


@pytest.mark.parametrize("side", SIDES)
def test_r15_box_outside_logical_parameter(side: str) -> None:
    # Offset 12 decodes to (3,0) of (4,4), but a (2,4) box there runs to row 5.
    bad = pmap(
        (4, 4), {0: (4, 4)},
        {0: [piece((2, 4), 0, (4, 1), 0, (4, 1), [0]), piece((2, 4), 12, (4, 1), 8, (4, 1), [0])]},
    )
    refuse(InvalidMapError, "outside the logical parameter", on_side(bad, side),
           side=side, location=0, piece_index=1)


@pytest.mark.parametrize("side", SIDES)
def test_r15_box_outside_shard(side: str) -> None:
    # Dest offset 4 decodes to (1,0) of a (2,4) shard, but a (2,4) box there runs to row 3.
    bad = pmap(
        (4, 4), {0: (2, 4), 1: (2, 4)},
        {0: [piece((2, 4), 0, (4, 1), 4, (4, 1), [0])], 1: [piece((2, 4), 8, (4, 1), 0, (4, 1), [1])]},
    )
    refuse(InvalidMapError, r"outside the\b.*\bshard", on_side(bad, side), side=side, location=0, piece_index=0)


@pytest.mark.parametrize("side", SIDES)
def test_r16_per_location_pair_budget(side: str) -> None:
    # 16 pieces on one location: tiling its shard needs more than one comparison.
    bad = pmap((16, 2), {0: (16, 2)}, {0: [piece((1, 2), 2 * i, (2, 1), 2 * i, (2, 1), [0]) for i in range(16)]})
    refuse(AffineTransferError, "max_pair_checks", on_side(bad, side, limits=PlanBudget(max_pair_checks=1)))


@pytest.mark.parametrize("side", SIDES)
def test_r17_same_shard_addresses_a5(side: str) -> None:
    # A5: numels sum to 16 and the logical boxes tile F, yet location 0 writes dest 0.. twice.
    bad = pmap(
        (4, 4), {0: (4, 2), 1: (4, 2)},
        {
            0: [piece((2, 2), 0, (4, 1), 0, (2, 1), [0]), piece((2, 2), 8, (4, 1), 0, (2, 1), [0])],
            1: [piece((2, 2), 2, (4, 1), 0, (2, 1), [1]), piece((2, 2), 10, (4, 1), 4, (2, 1), [1])],
        },
    )
    refuse(InvalidMapError, r"same\s+shard addresses", on_side(bad, side), side=side, location=0)


@pytest.mark.parametrize("side", SIDES)
def test_r17_double_write_counterexample_8624(side: str) -> None:
    # #8624: shard (4,); A maps src[0:2] -> dest[0:2], B maps src[2:4] -> dest[0:2].
    # Source coverage is complete and numels sum to 4; dest write counts would be [2,2,0,0].
    bad = pmap((4,), {0: (4,)}, {0: [piece((2,), 0, (1,), 0, (1,), [0]), piece((2,), 2, (1,), 0, (1,), [0])]})
    refuse(InvalidMapError, "same shard addresses", on_side(bad, side), side=side, location=0)


@pytest.mark.parametrize("side", SIDES)
def test_r18_pieces_must_account_for_shard(side: str) -> None:
    bad = pmap(
        (4, 4), {0: (4, 4), 1: (2, 4)},
        {0: [piece((2, 4), 0, (4, 1), 0, (4, 1), [0])], 1: [piece((2, 4), 8, (4, 1), 0, (4, 1), [1])]},
    )
    refuse(InvalidMapError, "account for", on_side(bad, side), side=side, location=0)


@pytest.mark.parametrize("side", SIDES)
def test_r19_holder_pair_budget(side: str) -> None:
    bad = replicate(contiguous_split_map((8, 4), [2, 2, 2, 2], 0), 4)
    refuse(AffineTransferError, "max_pair_checks", on_side(bad, side, limits=PlanBudget(max_pair_checks=1)))


@pytest.mark.parametrize("side", SIDES)
def test_r20_overlapping_logical_pieces(side: str) -> None:
    # Location 0 stores rows 0-1 and rows 1-2 at disjoint shard addresses.
    bad = pmap(
        (4, 4), {0: (4, 4), 1: (1, 4)},
        {
            0: [piece((2, 4), 0, (4, 1), 0, (4, 1), [0]), piece((2, 4), 4, (4, 1), 8, (4, 1), [0])],
            1: [piece((1, 4), 12, (4, 1), 0, (4, 1), [1])],
        },
    )
    refuse(InvalidMapError, "overlapping logical pieces", on_side(bad, side), side=side, location=0)


@pytest.mark.parametrize("side", SIDES)
def test_r21_holder_does_not_hold_all(side: str) -> None:
    # Location 0 declares {0,1} for all of F, but location 1 holds only row 0.
    bad = pmap(
        (2, 4), {0: (2, 4), 1: (1, 4)},
        {0: [piece((2, 4), 0, (4, 1), 0, (4, 1), [0, 1])], 1: [piece((1, 4), 0, (4, 1), 0, (4, 1), [0, 1])]},
    )
    refuse(InvalidMapError, "does not hold all of", on_side(bad, side), side=side, location=0, piece_index=0)


@pytest.mark.parametrize("side", SIDES)
def test_r21_undeclared_holder_a2(side: str) -> None:
    # A2: locations 0 and 1 each hold rows 0-3 of (8,8) but declare {0} and {1}.
    bad = pmap(
        (8, 8), {0: (4, 8), 1: (4, 8), 2: (4, 8)},
        {
            0: [piece((4, 8), 0, (8, 1), 0, (8, 1), [0])],
            1: [piece((4, 8), 0, (8, 1), 0, (8, 1), [1])],
            2: [piece((4, 8), 32, (8, 1), 0, (8, 1), [2])],
        },
    )
    refuse(InvalidMapError, "different locations", on_side(bad, side, replicated_map((8, 8), 1)), side=side)


@pytest.mark.parametrize("side", SIDES)
def test_r21_a15_both_hold_but_declare_one(side: str) -> None:
    bad = pmap((4,), {0: (4,), 1: (4,)}, {r: [piece((4,), 0, (1,), 0, (1,), [0])] for r in (0, 1)})
    refuse(InvalidMapError, "different locations", on_side(bad, side), side=side)


@pytest.mark.parametrize("side", SIDES)
def test_r21_a16_declared_holder_missing(side: str) -> None:
    bad = pmap((4,), {0: (4,)}, {0: [piece((4,), 0, (1,), 0, (1,), [0, 1])]})
    refuse(InvalidMapError, "different locations", on_side(bad, side), side=side)


def test_r21_a19_target_partial_declaration() -> None:
    # A19: target (2,4): location 0 holds all as {0,1}; location 1 holds row 0 as {0,1}, row 1 as {1}.
    bad = pmap(
        (2, 4), {0: (2, 4), 1: (2, 4)},
        {
            0: [piece((2, 4), 0, (4, 1), 0, (4, 1), [0, 1])],
            1: [piece((1, 4), 0, (4, 1), 0, (4, 1), [0, 1]), piece((1, 4), 4, (4, 1), 4, (4, 1), [1])],
        },
    )
    refuse(InvalidMapError, "different locations", on_side(bad, "target"), side="target")


def test_r22_region_pair_budget() -> None:
    src = contiguous_split_map((16, 2), [1] * 16, 0)
    refuse(AffineTransferError, "max_pair_checks",
           lambda: plan_transfer(replicated_map((16, 2), 1), src, PlanBudget(max_pair_checks=1)))


def test_r24_source_replicas_cut_differently_a20() -> None:
    # A20: source (2,4): location 0 one (2,4) piece, location 1 two (1,4) pieces, all {0,1}.
    bad = pmap(
        (2, 4), {0: (2, 4), 1: (2, 4)},
        {
            0: [piece((2, 4), 0, (4, 1), 0, (4, 1), [0, 1])],
            1: [piece((1, 4), 0, (4, 1), 0, (4, 1), [0, 1]), piece((1, 4), 4, (4, 1), 4, (4, 1), [0, 1])],
        },
    )
    refuse(UnsupportedLayoutError, "different piece boundaries", on_side(bad, "source"), side="source")


def test_r25_source_must_cover_a1() -> None:
    # A1: the source covers only rows 0-7 of a (16,8) F; the target is all of F.
    src = pmap((16, 8), {0: (8, 8)}, {0: [piece((8, 8), 0, (8, 1), 0, (8, 1), [0])]})
    msg = refuse(InvalidMapError, "of its", lambda: plan_transfer(replicated_map((16, 8), 1), src), side="source")
    assert "source pieces cover" in msg and "64" in msg and "128" in msg, msg


@pytest.mark.parametrize(
    "target",
    [
        pmap((4,), {0: (2,)}, {0: [piece((2,), 0, (1,), 0, (1,), [0])]}),
        pmap((4,), {}, {}),
    ],
    ids=["a17-half", "a18-nothing"],
)
def test_r26_target_must_cover_a17_a18(target: ParamAffineMap) -> None:
    refuse(InvalidMapError, "target pieces do not cover",
           lambda: plan_transfer(target, replicated_map((4,), 1)), side="target")


def test_r28_target_frame_tiling() -> None:
    # With R24 and R25 in force the source regions tile F, so R28 ("would receive X of its N") is
    # defence in depth that no map can reach first. A gap under a target frame must still be refused
    # with an "of its" message naming the count, whichever of R25 / R28 sees it first.
    src = pmap((16, 8), {0: (8, 8)}, {0: [piece((8, 8), 0, (8, 1), 0, (8, 1), [0])]})
    tgt = contiguous_split_map((16, 8), [4, 4, 4, 4], 0)
    refuse(InvalidMapError, r"of its \d+", lambda: plan_transfer(tgt, src))


def test_r27_region_target_pair_budget_a8() -> None:
    # A8 (max_pair_checks): row2 -> col4 (8,8) with a budget of a single comparison.
    refuse(AffineTransferError, "max_pair_checks",
           lambda: plan_transfer(contiguous_split_map((8, 8), [2] * 4, 1), contiguous_split_map((8, 8), [4, 4], 0),
                                 PlanBudget(max_pair_checks=1)))


def test_pair_budget_at_reported_count_is_accepted() -> None:
    tgt, src = contiguous_split_map((8, 8), [2] * 4, 1), contiguous_split_map((8, 8), [4, 4], 0)
    plan = plan_transfer(tgt, src)
    assert plan.statistics.pair_checks > 1
    again = plan_transfer(tgt, src, PlanBudget(max_pair_checks=plan.statistics.pair_checks))
    assert again.to_dict() == plan.to_dict()


@pytest.mark.parametrize("selector_result", [999, True, 1.5, None, "0"])
def test_r29_selector_result_a11(selector_result: Any) -> None:
    # A11: bigcode with a selector returning something that is not a validated holder.
    src = segmented_map((48, 8), [(32, False), (16, True)], 0, 2, [[16, 16]])
    tgt = segmented_map((48, 8), [(32, False), (16, True)], 0, 4, [[8, 8, 8, 8]])
    refuse(InvalidReplicaPolicyError, "",
           lambda: plan_transfer(tgt, src, replica_selector=lambda _req: selector_result))


def test_r30_merge_checks_a22() -> None:
    # A22: target (16,2), 16 single-row pieces listed in reverse shard order; max_merge_checks=10.
    tgt = pmap((16, 2), {0: (16, 2)},
               {0: [piece((1, 2), 2 * i, (2, 1), 2 * i, (2, 1), [0]) for i in reversed(range(16))]})
    src = replicated_map((16, 2), 1)
    refuse(AffineTransferError, "max_merge_checks",
           lambda: plan_transfer(tgt, src, PlanBudget(max_merge_checks=10)))
    plan = plan_transfer(tgt, src)  # the default budget folds them into one copy
    assert [s.shape for s in plan.segments] == [(16, 2)]
    assert_executes_exactly(plan, tgt, src)
    checks = plan.statistics.merge_checks
    assert checks >= 16
    plan_transfer(tgt, src, PlanBudget(max_merge_checks=checks))
    refuse(AffineTransferError, "max_merge_checks",
           lambda: plan_transfer(tgt, src, PlanBudget(max_merge_checks=checks - 1)))


def test_r31_max_segments_a8() -> None:
    tgt, src = contiguous_split_map((8, 8), [2] * 4, 1), contiguous_split_map((8, 8), [4, 4], 0)
    refuse(AffineTransferError, "max_segments", lambda: plan_transfer(tgt, src, PlanBudget(max_segments=1)))
    assert len(plan_transfer(tgt, src, PlanBudget(max_segments=8)).segments) == 8
    refuse(AffineTransferError, "max_segments", lambda: plan_transfer(tgt, src, PlanBudget(max_segments=7)))


def test_r32_max_plan_bytes_a8() -> None:
    tgt, src = contiguous_split_map((8, 8), [2] * 4, 1), contiguous_split_map((8, 8), [4, 4], 0)
    refuse(AffineTransferError, "max_plan_bytes", lambda: plan_transfer(tgt, src, PlanBudget(max_plan_bytes=1)))


def test_r32_plan_bytes_is_the_envelope_a21() -> None:
    # A21: replicated_map((4,),1) to itself; the budget measures exactly the encoded envelope.
    m = replicated_map((4,), 1)
    plan = plan_transfer(m, m)
    size = len(encode_plan(plan.to_dict()))
    assert plan.statistics.plan_bytes == size
    assert plan_transfer(m, m, PlanBudget(max_plan_bytes=size)).to_dict() == plan.to_dict()
    refuse(AffineTransferError, "max_plan_bytes", lambda: plan_transfer(m, m, PlanBudget(max_plan_bytes=size - 1)))


# ---------------------------------------------------------------------------------------------
# Adversarial cases not already covered above (A1-A9, A11-A12, A14-A22 are tests of their rules).


@pytest.mark.parametrize("corruption", ["source-offset-72", "source-strides-1-16", "scale-2"])
@pytest.mark.parametrize("index", [0, 1])
def test_a10_every_piece_corrupted_once(corruption: str, index: int) -> None:
    # A10: a valid (16,8) 2-row split with one piece corrupted; the target is a 4-row split.
    base = contiguous_split_map((16, 8), [8, 8], 0)
    pieces = {r: list(ps) for r, ps in base.pieces_by_rank.items()}
    p = pieces[index][0]
    src_off, src_str, scale = p.source_offset, p.source_strides, p.scale
    if corruption == "source-offset-72":
        src_off = 72
    elif corruption == "source-strides-1-16":
        src_str = (1, 16)
    else:
        scale = 2.0
    pieces[index][0] = piece(p.shape, src_off, src_str, p.dest_offset, p.dest_strides, p.locations, scale)
    bad = pmap((16, 8), base.shard_shapes, pieces)
    with pytest.raises(AffineTransferError) as info:
        plan_transfer(contiguous_split_map((16, 8), [4] * 4, 0), bad)
    assert type(info.value) is not AffineTransferError, "a corrupt map is not a budget refusal"
    assert re.search(rf"location {index}\b", str(info.value)), str(info.value)


@pytest.mark.parametrize("empty_side", SIDES)
def test_a13_empty_pieces_count_against_max_pieces(empty_side: str) -> None:
    # A13: F (0,1); one side lists 3 empty pieces, the other none; max_pieces_per_map=2.
    three = pmap((0, 1), {0: (0, 1)}, {0: [piece((0, 1), 0, (1, 1), 0, (1, 1), [0])] * 3})
    none = pmap((0, 1), {}, {})
    tgt, src = (three, none) if empty_side == "target" else (none, three)
    refuse(AffineTransferError, "max_pieces_per_map",
           lambda: plan_transfer(tgt, src, PlanBudget(max_pieces_per_map=2)), side=empty_side)
    plan = plan_transfer(tgt, src)  # within the default budget an empty parameter plans to nothing
    assert plan.segments == () and plan.moved_elements == 0


# ---------------------------------------------------------------------------------------------
# Budget: parts per request; invalid batch policies.


def _bigcode_pair() -> tuple[ParamAffineMap, ParamAffineMap]:
    src = segmented_map((48, 8), [(32, False), (16, True)], 0, 2, [[16, 16]])
    tgt = segmented_map((48, 8), [(32, False), (16, True)], 0, 4, [[8, 8, 8, 8]])
    return tgt, src


def _halves(req: ReplicaRequest, locations: Sequence[int]) -> list[ReplicaPart]:
    """Cut a request into two row halves served by ``locations[0]`` and ``locations[1]``."""
    rows = req.shape[0]
    top = rows // 2
    lo = (req.logical_origin[0], *req.logical_origin[1:])
    hi = (req.logical_origin[0] + top, *req.logical_origin[1:])
    return [
        ReplicaPart(lo, (top, *req.shape[1:]), locations[0]),
        ReplicaPart(hi, (rows - top, *req.shape[1:]), locations[1]),
    ]


def _splitting(requests: Sequence[ReplicaRequest]) -> list[Any]:
    return [
        _halves(r, [c.source_rank for c in r.candidates]) if len(r.candidates) > 1 else r.candidates[0].source_rank
        for r in requests
    ]


def test_max_parts_per_request() -> None:
    tgt, src = _bigcode_pair()
    with pytest.raises(AffineTransferError, match="max_parts_per_request") as info:
        plan_transfer(tgt, src, PlanBudget(max_parts_per_request=1), replica_policy=_splitting, min_split_bytes=1)
    assert "'param'" in str(info.value)
    plan = plan_transfer(tgt, src, PlanBudget(max_parts_per_request=2), replica_policy=_splitting,
                         min_split_bytes=1)
    assert plan.statistics.split_requests == 4
    assert_executes_exactly(plan, tgt, src)


def _wrong_count(requests: Sequence[ReplicaRequest]) -> list[Any]:
    return first_holder(requests)[:-1]


def _not_a_candidate(requests: Sequence[ReplicaRequest]) -> list[Any]:
    return [r.candidates[0].source_rank if len(r.candidates) == 1 else 7 for r in requests]


def _gap(requests: Sequence[ReplicaRequest]) -> list[Any]:
    return [_halves(r, [r.candidates[0].source_rank] * 2)[:1] if len(r.candidates) > 1 else r.candidates[0].source_rank
            for r in requests]


def _overlap(requests: Sequence[ReplicaRequest]) -> list[Any]:
    out: list[Any] = []
    for r in requests:
        if len(r.candidates) == 1:
            out.append(r.candidates[0].source_rank)
            continue
        a, b = _halves(r, [c.source_rank for c in r.candidates])
        out.append([ReplicaPart(a.logical_origin, r.shape, a.source_location), b])
    return out


def _outside(requests: Sequence[ReplicaRequest]) -> list[Any]:
    out: list[Any] = []
    for r in requests:
        if len(r.candidates) == 1:
            out.append(r.candidates[0].source_rank)
            continue
        shifted = (r.logical_origin[0] - 1, *r.logical_origin[1:])
        out.append([ReplicaPart(shifted, r.shape, r.candidates[0].source_rank)])
    return out


@pytest.mark.parametrize("policy", [_wrong_count, _not_a_candidate, _gap, _overlap, _outside],
                         ids=["count", "location", "gap", "overlap", "outside"])
def test_invalid_batch_policy_is_refused(policy: Callable[[Sequence[ReplicaRequest]], Any]) -> None:
    tgt, src = _bigcode_pair()
    with pytest.raises(InvalidReplicaPolicyError):
        plan_transfer(tgt, src, replica_policy=policy, min_split_bytes=1)


# ---------------------------------------------------------------------------------------------
# Endpoints and batches.


@pytest.mark.parametrize("missing_side", SIDES)
def test_endpoints_must_bind_every_location_with_data(missing_side: str) -> None:
    tgt, src = contiguous_split_map((8, 8), [2] * 4, 1), contiguous_split_map((8, 8), [4, 4], 0)
    source = {0: 0, 1: 1}
    target = {0: 0, 1: 1, 2: 2, 3: 3}
    if missing_side == "source":
        del source[1]
        missing = 1
    else:
        del target[3]
        missing = 3
    endpoints = TransferEndpoints(source, target)
    with pytest.raises(InvalidMapError) as info:
        plan_transfers({"w": (tgt, src)}, endpoints=endpoints)
    msg = str(info.value)
    assert re.search(rf"location {missing}\b", msg) and missing_side in msg, msg
    # With every location bound the same batch plans.
    full = plan_transfers({"w": (tgt, src)}, endpoints=TransferEndpoints({0: 0, 1: 1}, {0: 0, 1: 1, 2: 2, 3: 3}))
    assert full["w"].moved_elements == 64


def test_endpoints_need_not_bind_a_location_without_data() -> None:
    # Source location 2 has an empty shard and only an empty piece: nothing is read from it.
    base = contiguous_split_map((8, 8), [4, 4], 0)
    src = pmap((8, 8), {**base.shard_shapes, 2: (0, 8)},
               {**base.pieces_by_rank, 2: [piece((0, 8), 64, (8, 1), 0, (8, 1), [2])]})
    tgt = contiguous_split_map((8, 8), [2] * 4, 1)
    plans = plan_transfers({"w": (tgt, src)}, endpoints=TransferEndpoints({0: 0, 1: 1}, {0: 0, 1: 1, 2: 2, 3: 3}))
    assert {s.source_rank for s in plans["w"].segments} == {0, 1}
    assert_executes_exactly(plans["w"], tgt, src)


def test_no_partial_plan() -> None:
    good = (contiguous_split_map((8, 8), [2] * 4, 1), contiguous_split_map((8, 8), [4, 4], 0))
    bad_src = pmap((4,), {0: (4,)}, {0: [piece((2,), 0, (1,), 0, (1,), [0]), piece((2,), 2, (1,), 0, (1,), [0])]})
    bad = (replicated_map((4,), 1), bad_src)
    seen: list[int] = []

    def recording(requests: Sequence[ReplicaRequest]) -> Any:
        seen.append(len(requests))
        return balanced(requests)

    result: Any = "untouched"
    with pytest.raises(InvalidMapError) as info:
        result = plan_transfers({"a_good": good, "b_bad": bad}, replica_policy=recording)
    assert result == "untouched"
    assert "'b_bad'" in str(info.value) and "'a_good'" not in str(info.value)
    # The good parameter alone plans; the batch with it refused as a whole.
    assert plan_transfers({"a_good": good})["a_good"].moved_elements == 64


# ---------------------------------------------------------------------------------------------
# Must be accepted (facts §6, last paragraph), each executed.


def test_accept_non_contiguous_location_ids() -> None:
    src = pmap(
        (4, 16), {3: (4, 8), 9: (4, 8)},
        {3: [piece((4, 8), 0, (16, 1), 0, (8, 1), [3])], 9: [piece((4, 8), 8, (16, 1), 0, (8, 1), [9])]},
    )
    tgt = pmap((4, 16), {5: (1, 16), 2: (3, 16)},
               {5: [piece((1, 16), 0, (16, 1), 0, (16, 1), [5])], 2: [piece((3, 16), 16, (16, 1), 0, (16, 1), [2])]})
    plan = plan_transfer(tgt, src)
    assert {s.source_rank for s in plan.segments} == {3, 9}
    assert {s.target_rank for s in plan.segments} == {2, 5}
    assert_executes_exactly(plan, tgt, src)


def test_accept_target_replicas_cut_differently() -> None:
    tgt = pmap(
        (2, 4), {0: (2, 4), 1: (2, 4)},
        {
            0: [piece((2, 4), 0, (4, 1), 0, (4, 1), [0, 1])],
            1: [piece((1, 4), 0, (4, 1), 4, (4, 1), [0, 1]), piece((1, 4), 4, (4, 1), 0, (4, 1), [0, 1])],
        },
    )
    src = contiguous_split_map((2, 4), [1, 1], 0)
    plan = plan_transfer(tgt, src)
    run = assert_executes_exactly(plan, tgt, src)
    assert sorted(run.writes) == [0, 1]


def test_accept_identity() -> None:
    m = contiguous_split_map((6, 4), [3, 3], 0)
    plan = plan_transfer(m, m)
    assert all(s.source_rank == s.target_rank for s in plan.segments)
    assert_executes_exactly(plan, m, m)


def test_accept_billion_rows() -> None:
    rows = 10**9
    src = contiguous_split_map((rows, 8), [rows // 2] * 2, 0)
    plan = plan_transfer(contiguous_split_map((rows, 8), [2] * 4, 1), src)
    assert plan.moved_elements == 8 * rows
    assert len(plan.segments) == 8


@pytest.mark.parametrize("shape, degrees", [((11, 8), (2, 4)), ((23, 5), (4, 2)), ((7, 13), (1, 3))])
@pytest.mark.parametrize("axes", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_accept_uneven_splits(shape: tuple[int, int], degrees: tuple[int, int], axes: tuple[int, int]) -> None:
    src = contiguous_split_map(shape, split(shape[axes[0]], degrees[0]), axes[0])
    tgt = contiguous_split_map(shape, split(shape[axes[1]], degrees[1]), axes[1])
    assert_executes_exactly(plan_transfer(tgt, src), tgt, src)


@pytest.mark.parametrize("side", SIDES)
def test_accept_empty_piece_with_out_of_range_running_offset(side: str) -> None:
    # Location 1 holds none of the second sub-parameter: its empty piece starts one past the end
    # of its shard (dest 32 of 32) and of F (source 96 of 96).
    m = sub_param_map((12, 8), (8, 4), [[4, 4], [4, 0]], 0)
    empty = [p for p in m.pieces_by_rank[1] if p.numel == 0]
    assert empty and empty[0].dest_offset == 32 and empty[0].source_offset == 96
    other = contiguous_split_map((12, 8), split(12, 3), 0)
    plan = on_side(m, side, other)()
    target, source = (other, m) if side == "source" else (m, other)
    assert_executes_exactly(plan, target, source)


def test_accept_sub_param_map_builder_with_zero_widths() -> None:
    m = sub_param_map((12, 8), (8, 4), [[8, 0], [2, 2]], 0)
    other = contiguous_split_map((12, 8), [6, 6], 0)
    assert_executes_exactly(plan_transfer(other, m), other, m)
    assert_executes_exactly(plan_transfer(m, other), m, other)
