"""Row-major addresses (theorem3.md §3.3): injectivity, range, and the frame address rule.

Every frame's shard strides are the row-major strides of its shard shape (rule R13), and a
piece's ``dest_offset`` decodes to a coordinate of the shard (R14). The facts below turn Premise
A, a statement about local *boxes*, into a statement about shard *addresses*:

* ``row_major_injective``: inside a shard, distinct coordinates have distinct addresses;
* ``row_major_range``: the address of a coordinate inside the shard lies in [0, numel);
* ``frame_address`` (Lemma 1): the address the planner computes for element j of a sub-box X of a
  frame (``frame.offset + Σ (X.origin - box.origin)·strides + Σ j·strides``) is the row-major
  address of the shard coordinate that holds logical point X.origin + j, and that coordinate lies
  in the frame's local box;

Two frames of one location with disjoint local boxes never share an address: their coordinates
differ (``tiling.separated_has_no_common_point``) and distinct coordinates have distinct addresses
(``row_major_injective``). z3 does not finish that composition as one nonlinear query in 20 s for
n >= 2, so it is stated as the two proved claims plus one line of logic (theorem3.md §3.3).

Shapes, strides, offsets and coordinates are all symbolic; the products make these nonlinear, and
z3 proves them for up to ``MAX_AXES`` axes. With |shard| = numel coordinates mapped injectively
into [0, numel), the map is also onto (pigeonhole, on paper), so coordinates and addresses are
in bijection.
"""

from __future__ import annotations

from collections.abc import Iterator

import z3
from kit import Claim, SymBox, dot, ints, main, product, row_major, show_boxes, show_ints

MAX_AXES = 5


def _in_shard(coord: list[z3.ArithRef], shape: list[z3.ArithRef]) -> z3.BoolRef:
    return z3.And(*[z3.And(c >= 0, c < s) for c, s in zip(coord, shape)])


def injective(n: int) -> Claim:
    shape, c, d = ints("s", n), ints("c", n), ints("d", n)
    strides = row_major(shape)
    return Claim(
        f"addresses.row_major_injective[n={n}]", f"n={n}, symbolic shape",
        {
            "shape positive": z3.And(*[s >= 1 for s in shape]),
            "c in shard": _in_shard(c, shape),
            "d in shard": _in_shard(d, shape),
            "same address": dot(c, strides) == dot(d, strides),
        },
        z3.And(*[x == y for x, y in zip(c, d)]),
        ["d in shard"] if n >= 2 else ["same address"],
        lambda m: show_ints(m, {"shape": shape, "c": c, "d": d}),
    )


def in_range(n: int) -> Claim:
    shape, c = ints("s", n), ints("c", n)
    address = dot(c, row_major(shape))
    return Claim(
        f"addresses.row_major_range[n={n}]", f"n={n}, symbolic shape",
        {"shape positive": z3.And(*[s >= 1 for s in shape]), "c in shard": _in_shard(c, shape)},
        {"the address is >= 0": address >= 0, "the address is < numel": address < product(shape)},
        ["c in shard"], lambda m: show_ints(m, {"shape": shape, "c": c}),
    )


def frame_start_model(local_origin: list[z3.ArithRef], logical_origin: list[z3.ArithRef],
                      sub_origin: list[z3.ArithRef], strides: list[z3.ArithRef]) -> z3.ArithRef:
    """The shard offset of sub-box X's first element (``Frame.address``, and the offsets
    ``build_requests`` gives a request and each candidate): the frame's offset, which decodes to
    its local origin (R14), moved by ``X.origin - G.origin``."""
    offset = dot(local_origin, strides)
    return offset + dot([x - g for x, g in zip(sub_origin, logical_origin)], strides)


def frame_address(n: int) -> Claim:
    """Lemma 1 for one frame: logical box G, local box L (same extents) inside shard ``shape``."""
    shape = ints("s", n)
    strides = row_major(shape)
    logical = SymBox("G", n)
    local = SymBox("L", n, extent=logical.extent)
    sub = SymBox("X", n)
    j = ints("j", n)
    start = frame_start_model(local.origin, logical.origin, sub.origin, strides)
    element = start + dot(j, strides)
    coord = [lo + x + jj - g for lo, x, jj, g in zip(local.origin, sub.origin, j, logical.origin)]
    return Claim(
        f"addresses.frame_address[n={n}]", f"n={n}, symbolic shape, boxes and index",
        {
            "shape positive": z3.And(*[s >= 1 for s in shape]),
            "local box inside shard": local.inside(SymBox("S", n, [z3.IntVal(0)] * n, shape)),
            "X inside G": sub.inside(logical),
            "j indexes X": z3.And(*[z3.And(jj >= 0, jj < e) for jj, e in zip(j, sub.extent)]),
        },
        {
            "element j is the row-major address of its coordinate": element == dot(coord, strides),
            "the coordinate lies in the shard": _in_shard(coord, shape),
            "the coordinate lies in the local box": local.has(coord),
        },
        ["local box inside shard", "X inside G", "j indexes X"],
        show_boxes(logical, local, sub, shape=shape, j=j),
        outright=["element j is the row-major address of its coordinate"],
    )


def claims() -> Iterator[Claim]:
    for n in range(1, MAX_AXES + 1):
        yield injective(n)
        yield in_range(n)
        yield frame_address(n)


if __name__ == "__main__":
    main(claims())
