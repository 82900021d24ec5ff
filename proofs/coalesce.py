"""The coalescing lemma (theorem3.md §3.4): folding keeps the (read, write) address pairs.

``refplan.plan.coalesce`` joins segment a with segment b along axis d when they share source and
target location and both stride vectors, b starts where a ends along d *on both sides*
(``b.src = a.src + a.shape[d]·src_strides[d]``, same for the target), and every other extent is
equal. The merged segment m keeps a's offsets and has ``m.shape[d] = a.shape[d] + b.shape[d]``.

* ``merge_pairs``: the index box of m is the disjoint union of a's index box and b's shifted by
  a.shape[d], and element for element the (read, write) address pairs agree, so the multiset of
  pairs is unchanged. Strides, offsets and extents are symbolic (any integers, not only row-major).
* ``merge_stays_box``: refplan's extra guard (the merged extent stays inside the shard on axis d,
  from the segment's decoded start coordinate) keeps m a box of its shard, so its elements have
  pairwise distinct addresses inside the shard. Without the guard a merge can wrap into the next
  row and write one address twice; z3 shows such an aliasing merge when the guard is dropped.
  The guard covers axis d only: the claim also needs m inside the shard on every *other* axis,
  which holds because a and b are boxes of the shard (every emitted segment is, and each merge
  keeps it so, by induction over the merges). Dropping that premise gives a counterexample too.
"""

from __future__ import annotations

from collections.abc import Iterator

import z3
from kit import Claim, dot, ints, main, product, row_major, show_ints

MAX_AXES = 8
"""``merge_pairs`` for every n <= max_ndim (linear in the indexes once strides are fixed terms)."""
BOX_AXES = 4
"""``merge_stays_box`` up to here; at n = 5 one non-vacuity query runs out of ``kit.RLIMIT``, so
n = 5..8 is the paper argument of theorem3.md §3.4."""


def _indexes(j: list[z3.ArithRef], extent: list[z3.ArithRef]) -> z3.BoolRef:
    return z3.And(*[z3.And(x >= 0, x < e) for x, e in zip(j, extent)])


def merged_extent(a_ext: list[z3.ArithRef], b_ext: list[z3.ArithRef], axis: int) -> list[z3.ArithRef]:
    """The merged segment's shape: a's, with b's extent added on ``axis``."""
    m_ext = list(a_ext)
    m_ext[axis] = a_ext[axis] + b_ext[axis]
    return m_ext


def adjacency(a_src: z3.ArithRef, a_dst: z3.ArithRef, a_ext: list[z3.ArithRef], b_src: z3.ArithRef,
              b_dst: z3.ArithRef, b_ext: list[z3.ArithRef], ss: list[z3.ArithRef], ts: list[z3.ArithRef],
              axis: int) -> dict[str, z3.BoolRef]:
    """When ``coalesce`` finds b as a's successor on ``axis`` (its fold-key lookup), named as the
    premises of ``merge_pairs``."""
    return {
        "source adjacent": b_src == a_src + a_ext[axis] * ss[axis],
        "target adjacent": b_dst == a_dst + a_ext[axis] * ts[axis],
        "other extents equal": z3.And(*[a_ext[d] == b_ext[d] for d in range(len(a_ext)) if d != axis]),
    }


def merge_guard(start: list[z3.ArithRef], m_ext: list[z3.ArithRef], shape: list[z3.ArithRef], axis: int) -> z3.BoolRef:
    """``coalesce``'s extra guard on one side: the merged extent stays inside that side's shard on
    ``axis``, from the segment's decoded start coordinate. ``coalesce`` merges exactly when
    ``adjacency`` holds and this guard holds on the source side *and* on the target side."""
    return start[axis] + m_ext[axis] <= shape[axis]


def merge_pairs(n: int, axis: int) -> Claim:
    ss, ts = ints("ss", n), ints("ts", n)  # source and target strides (shared by a and b)
    a_src, a_dst, b_src, b_dst = z3.Ints("a.src a.dst b.src b.dst")
    a_ext, b_ext = ints("a.e", n), ints("b.e", n)
    m_ext = merged_extent(a_ext, b_ext, axis)
    shift = [a_ext[axis] if d == axis else z3.IntVal(0) for d in range(n)]

    def pair(src: z3.ArithRef, dst: z3.ArithRef, j: list[z3.ArithRef]) -> tuple[z3.ArithRef, z3.ArithRef]:
        return src + dot(j, ss), dst + dot(j, ts)

    def same(p: tuple[z3.ArithRef, z3.ArithRef], q: tuple[z3.ArithRef, z3.ArithRef]) -> z3.BoolRef:
        return z3.And(p[0] == q[0], p[1] == q[1])

    j, ja, jb = ints("j", n), ints("ja", n), ints("jb", n)
    back = [x - s for x, s in zip(j, shift)]
    fwd = [x + s for x, s in zip(jb, shift)]
    # m keeps a's offsets, so m's pair at index j is pair(a_src, a_dst, j) over m's larger index box.
    goal = {
        "every element of m is one of a or of b, with its (read, write) pair": z3.Implies(_indexes(j, m_ext), z3.Or(
            _indexes(j, a_ext),
            z3.And(_indexes(back, b_ext), same(pair(a_src, a_dst, j), pair(b_src, b_dst, back))),
        )),
        "every element of a is one of m": z3.Implies(_indexes(ja, a_ext), _indexes(ja, m_ext)),
        "every element of b is one of m, with its pair": z3.Implies(_indexes(jb, b_ext), z3.And(
            _indexes(fwd, m_ext), same(pair(b_src, b_dst, jb), pair(a_src, a_dst, fwd)))),
        # so multiplicities are kept
        "no element of m is claimed by both a and b":
            z3.Implies(z3.And(_indexes(ja, a_ext), _indexes(jb, b_ext)), z3.Or(*[x != y for x, y in zip(ja, fwd)])),
    }
    others = [d for d in range(n) if d != axis]
    premises = {
        "a positive": z3.And(*[e >= 1 for e in a_ext]),
        "b positive": z3.And(*[e >= 1 for e in b_ext]),
        **adjacency(a_src, a_dst, a_ext, b_src, b_dst, b_ext, ss, ts, axis),
    }
    essential = ["source adjacent", "target adjacent"] + (["other extents equal"] if others else [])
    names = {"ss": ss, "ts": ts, "a.src": a_src, "a.dst": a_dst, "a.shape": a_ext, "b.src": b_src,
             "b.dst": b_dst, "b.shape": b_ext, "j": j, "ja": ja, "jb": jb}
    return Claim(
        f"coalesce.merge_pairs[n={n},axis={axis}]", f"n={n}, axis {axis}, symbolic strides",
        premises, goal, essential, lambda m: show_ints(m, names),
        # a's indexes on ``axis`` stay below a.shape[axis], b's shifted ones start there
        outright=["no element of m is claimed by both a and b"],
    )


def merge_stays_box(n: int, axis: int) -> Claim:
    """One side of a merged segment m (the other side is the same statement with its own shard)."""
    shape = ints("s", n)
    strides = row_major(shape)
    start = ints("c", n)  # decoded coordinate of m's offset in the shard
    ext = ints("m.e", n)
    j, k = ints("j", n), ints("k", n)

    def address(idx: list[z3.ArithRef]) -> z3.ArithRef:
        return dot(start, strides) + dot(idx, strides)

    others = [d for d in range(n) if d != axis]
    premises = {
        "shape positive": z3.And(*[s >= 1 for s in shape]),
        "start in shard": z3.And(*[z3.And(c >= 0, c < s) for c, s in zip(start, shape)]),
        "merged extents positive": z3.And(*[e >= 1 for e in ext]),
        "other axes inside shard": z3.And(*[start[d] + ext[d] <= shape[d] for d in others]),
        "merge guard": merge_guard(start, ext, shape, axis),
        "j, k index m": z3.And(_indexes(j, ext), _indexes(k, ext)),
    }
    goal = {
        "distinct indexes of m have distinct addresses": z3.Implies(
            z3.Or(*[x != y for x, y in zip(j, k)]), address(j) != address(k)),
        "every address of m is >= 0": address(j) >= 0,
        "every address of m is < numel(shard)": address(j) < product(shape),
    }
    essential = ["merge guard", *(["other axes inside shard"] if n >= 2 else [])]
    named = {"shape": shape, "start": start, "m.shape": ext, "j": j, "k": k}
    return Claim(
        f"coalesce.merge_stays_box[n={n},axis={axis}]", f"n={n}, axis {axis}, symbolic shard shape",
        premises, goal, essential, lambda m: show_ints(m, named),
        # at n = 1 the address is start + j itself
        outright=["distinct indexes of m have distinct addresses"] if n == 1 else [],
    )


def claims() -> Iterator[Claim]:
    for n in range(1, MAX_AXES + 1):
        for axis in range(n):
            yield merge_pairs(n, axis)
    for n in range(1, BOX_AXES + 1):
        for axis in range(n):
            yield merge_stays_box(n, axis)


if __name__ == "__main__":
    main(claims())
