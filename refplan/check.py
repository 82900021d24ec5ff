"""The exact checks on a replica policy's answers (Theorem 3's hypotheses).

Theorem 3 says: if every part of every answer is served by a validated holder of its request's
region, and the parts of each answer tile the request's box exactly, then every target address
receives exactly one copy of the right logical element, and (replicas agreeing) the copied bytes
are identical whichever holders were chosen. ``check_answers`` establishes exactly those
hypotheses, for *any* policy, before a single segment is emitted:

- one answer per request, in order;
- an ``int`` answer is a real ``int`` (``type(x) is int``: ``True`` and ``1.0`` are refused) naming
  one of that request's candidates;
- a split is a sequence of ``ReplicaPart`` whose parts each name a candidate, have the request's
  number of axes and positive integer extents, lie inside the box, are pairwise disjoint (sort/
  partition, not all pairs, when there are many) and whose volumes sum to the box's volume. By
  the tiling lemma those together mean the parts tile the box exactly;
- a real split (≥ 2 parts) has every part of at least ``min_split_bytes``: a part pays for the
  extra round it adds only above roughly α·β of the link, and the default is the executor's
  default staging budget (8 MiB), so a part never has to be split again just to be staged;
- splits stay within ``max_parts_per_request`` and, summed per parameter, ``max_segments``.

Every failure is an ``InvalidReplicaPolicyError`` naming the answer index, parameter, target
location and box, and what is wrong.

What a policy returns is read exactly once: each part's origin, shape and location are copied
into tuples of ``int`` (a snapshot), the snapshot is checked, and only the snapshot is used
afterwards. A policy's own sequence types could otherwise yield ints to the check and floats or
numpy integers to the planner. Messages quote policy values with ``maps.describe``, which cannot
raise, so an object whose ``__repr__`` raises still ends as an ``InvalidReplicaPolicyError``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from itertools import islice
from typing import Any

from . import limits
from .box import Box, first_overlap
from .errors import InvalidReplicaPolicyError, show_int, show_ints, type_name
from .limits import PlanBudget, as_budget, element_sizes
from .maps import describe
from .requests import ReplicaCandidate, ReplicaPart, ReplicaRequest, _new_candidate, uniform_read

__all__ = ["DEFAULT_MIN_SPLIT_BYTES", "ResolvedAnswer", "check_answers"]

DEFAULT_MIN_SPLIT_BYTES = 8 << 20
"""Smallest part of a split, in bytes (elements when no element size is known).

Tied to the executor's default ``StagingBudget.bytes_per_peer`` (8 MiB); a policy with calibrated
link numbers should pass ``min_split_bytes ≈ k·α·β`` instead.
"""

ResolvedAnswer = tuple[tuple[Box, ReplicaCandidate], ...]
"""An answer after checking: each part's box with the candidate that serves it."""

_new_box = partial(tuple.__new__, Box)
"""``Box(origin, extent)`` without the named tuple's Python ``__new__`` (once per request)."""


def _fail(index: int, request: ReplicaRequest, what: str, name: str) -> InvalidReplicaPolicyError:
    """The error for answer ``index``; ``name`` is the parameter it belongs to (a request may be
    its layout's shared one, which carries the first such parameter's name)."""
    return InvalidReplicaPolicyError(
        f"replica policy answer {index} (parameter {name!r}, target location "
        f"{request.target_location}, box {request.box}): {what}"
    )


def _instance(value: object, kinds: type | tuple[type, ...]) -> bool:
    """``isinstance`` for what a policy returned: ``False`` where asking raises. ``isinstance``
    reads ``value.__class__``, and an object whose ``__class__`` property raises (a broken proxy)
    sent its exception out of the planner as is; not being what the check needs, it is refused as
    such, in the check's words."""
    try:
        return isinstance(value, kinds)
    except Exception:
        return False


def _exc_text(exc: BaseException) -> str:
    """``Class: message`` of an exception a policy's object raised; its ``__str__`` may raise too."""
    try:
        text = str(exc)
    except Exception:
        text = ""
    return f"{type_name(exc)}: {describe(text)[1:-1]}" if text else type_name(exc)


def _int_tuple(value: Any) -> tuple[int, ...] | None:
    """A snapshot of ``value`` as a tuple of ``int``, or ``None``; ``value`` is iterated once."""
    if not isinstance(value, (tuple, list)):
        return None
    snapshot = tuple(value)
    if not all(type(v) is int for v in snapshot):
        return None
    return snapshot


def _candidate(index: int, request: ReplicaRequest, location: Any, name: str) -> ReplicaCandidate:
    if type(location) is not int:
        what = f"location {describe(location)} ({type_name(location)}) is not an int location"
        raise _fail(index, request, what, name)
    for cand in request.candidates:
        if cand.source_rank == location:
            return cand
    what = f"location {show_int(location)} is not one of its validated holders {list(request.locations)}"
    raise _fail(index, request, what, name)


def _check_split(
    index: int,
    request: ReplicaRequest,
    answer: Sequence[Any],
    element_size: int | None,
    min_split_bytes: int,
    name: str,
    count: int,
) -> ResolvedAnswer:
    """The parts of one split, each read once, by index, up to ``count`` (the length read when the
    budget was checked): code the policy controls runs while the parts are read (a part's
    ``logical_origin`` may be a ``tuple`` subclass) and may change a live list, so a list that
    then holds another number of parts is refused, and what is planned is only what was read."""
    box = request.box

    def fail(what: str) -> InvalidReplicaPolicyError:
        return _fail(index, request, what, name)

    if count == 0:
        raise fail("an empty split leaves the whole box unwritten")
    parts: list[tuple[Box, ReplicaCandidate]] = []
    # A million copies of one part under a budget that allows them (max_parts_per_request=2**63)
    # were each checked before the volume sum refused them: 20 s. A repeat is refused on sight.
    seen: dict[Box, int] = {}
    for k in range(count):
        try:
            part = answer[k]
        except IndexError:
            raise fail(f"the split changed while it was checked: it no longer has part {k}") from None
        if not _instance(part, ReplicaPart):
            raise fail(f"part {k} is a {type_name(part)}, not a ReplicaPart")
        try:  # read each field once; a subclass's properties or a field's __iter__ may raise
            origin = _int_tuple(part.logical_origin)
            shape = _int_tuple(part.shape)
            location = part.source_location
        except Exception as exc:
            raise fail(f"part {k} cannot be read: {type_name(exc)}") from exc
        if origin is None or shape is None:
            raise fail(f"part {k}: origin and shape must be sequences of int")
        if len(origin) != box.ndim or len(shape) != box.ndim:
            raise fail(f"part {k} has {len(origin)}/{len(shape)} axes, the box has {box.ndim}")
        if any(e <= 0 for e in shape):
            raise fail(f"part {k} has a zero or negative extent {show_ints(shape)}")
        pbox = Box(origin, shape)
        if not box.contains(pbox):
            raise fail(f"part {k} {pbox} lies outside the request's box")
        earlier = seen.setdefault(pbox, k)
        if earlier != k:  # a repeat is an overlap: said at once, not after walking every later part
            raise fail(f"parts {earlier} and {k} overlap in {pbox}")
        parts.append((pbox, _candidate(index, request, location, name)))
    if len(answer) != count:
        raise fail(f"the split changed while it was checked: {count} parts when it was read, {len(answer)} after")
    total = sum(p.volume for p, _ in parts)
    if total != box.volume:
        raise fail(f"parts hold {total} elements but the box has {box.volume} (gap or overlap)")
    if len(parts) <= limits.PAIRWISE_LIMIT:
        for a in range(len(parts)):
            for b in range(a + 1, len(parts)):
                if parts[a][0].overlaps(parts[b][0]):
                    raise fail(f"parts {a} and {b} overlap in {parts[a][0].intersect(parts[b][0])}")
    else:
        # Inside the box and summing to its volume, the parts tile it exactly when they are
        # disjoint: ``first_overlap`` decides, stopping at the first overlap and never listing the
        # pairs that overlap (listing them made a refusal of k identical parts cost k**2: 13 s and
        # 2 GB at 4096 parts). ``covers`` decided it until 2026-12-07, and parts sharing one point
        # made its leaves' subtractions explode (128 parts of an 8-d box: 276 s, 4 GB).
        pair = first_overlap([p for p, _ in parts])
        if pair is not None:
            a, b = pair
            raise fail(f"parts {a} and {b} overlap in {parts[a][0].intersect(parts[b][0])}")
    if len(parts) >= 2:
        unit = element_size if element_size is not None else 1
        for k, (pbox, _) in enumerate(parts):
            size = pbox.volume * unit
            if size < min_split_bytes:
                what = "bytes" if element_size is not None else "elements (no element_size given)"
                raise fail(f"part {k} of a split is {size} {what}, below min_split_bytes={min_split_bytes}")
    return tuple(parts)


def check_answers(
    requests: Sequence[ReplicaRequest],
    answers: Any,
    *,
    element_size: Mapping[str, int] | int | None = None,
    min_split_bytes: int = DEFAULT_MIN_SPLIT_BYTES,
    budget: PlanBudget | None = None,
    parameters: Sequence[str] | None = None,
) -> list[ResolvedAnswer]:
    """Check a policy's ``answers`` to ``requests`` exactly; return each answer's parts.

    Raises ``InvalidReplicaPolicyError`` on the first failure. Accepting means each request's box
    is tiled by parts served by validated holders (Theorem 3's hypotheses). ``parameters`` names
    the parameter of each request when it differs from ``request.parameter``: the planner checks
    twins of a layout against that layout's one set of requests (element sizes, the per-parameter
    segment count and every message go by this name). ``element_size`` is what
    ``plan_transfers`` takes, checked by the same rule (``limits.element_sizes``): a bad one is
    the caller's ``ValueError``/``TypeError``, never blamed on the policy.
    """
    budget = as_budget(budget, "budget")
    if _instance(answers, (str, bytes)) or not _instance(answers, Sequence):
        raise InvalidReplicaPolicyError(
            f"replica policy returned a {type_name(answers)}; expected a sequence of {len(requests)} answers"
        )
    try:  # a policy's own sequence type may raise from len() or indexing: still the policy's error
        count = len(answers)
        if count != len(requests):
            raise InvalidReplicaPolicyError(
                f"replica policy returned {count} answers for {len(requests)} requests; "
                "exactly one answer per request is required"
            )
        # Snapshotted, even an exact list: code the policy controls (a part's ``__iter__``) runs
        # while the answers are checked, and could shorten the list it returned under ``zip``,
        # leaving requests with no answer and no segment (a plan the oracle calls invalid).
        kind = type_name(answers)
        # At most one answer past the count it claimed: a sequence whose __len__ lies small while
        # its iterator never ends was copied without bound (an outside probe, 2026-12-07).
        answers = tuple(islice(answers, len(requests) + 1))
    except InvalidReplicaPolicyError:
        raise
    except Exception as exc:
        raise InvalidReplicaPolicyError(
            f"replica policy returned a {type_name(answers)} that cannot be read: {_exc_text(exc)}"
        ) from exc
    if len(answers) != len(requests):
        raise InvalidReplicaPolicyError(
            f"replica policy's {kind} claimed {count} answers but held {len(answers)}"
        )
    names = [r.parameter for r in requests] if parameters is None else parameters
    if len(names) != len(requests):
        raise ValueError(f"{len(names)} parameter names for {len(requests)} requests")
    # Before, an int here was "'int' object is not subscriptable", a missing name a bare KeyError,
    # and a size of 0 a policy error ("part 0 of a split is 0 bytes"): all the caller's.
    sizes = element_sizes(list(dict.fromkeys(names)), element_size)
    resolved: list[ResolvedAnswer] = []
    parts_per_parameter: dict[str, int] = {}
    split_parameters: set[str] = set()
    # A layout's twins share request objects, and a policy mostly answers them alike: the
    # resolved form of an int answer (immutable) is worked out once per (request object,
    # location). The entry holds the request, so its id cannot be reused while the entry lives.
    # When no request object repeats (a batch of distinct layouts), nothing could be reused, so
    # the memo is not consulted at all; every answer is then checked in full below.
    accepted: dict[tuple[int, int], tuple[ReplicaRequest, ResolvedAnswer]] = {}
    sharing = len(set(map(id, requests))) != len(requests)
    max_segments = budget.max_segments
    for index, (request, answer, name) in enumerate(zip(requests, answers, names)):
        one: ResolvedAnswer
        if type(answer) is int:
            entry = accepted.get((id(request), answer)) if sharing else None
            if entry is not None and entry[0] is request:
                one = entry[1]
            else:
                uniform = uniform_read(request)
                if uniform is not None and answer in uniform[0]:
                    # A holder of a uniform request: its candidate is (answer, *read), made here
                    # instead of all of them (``requests._UniformRequest``).
                    offset, strides = uniform[1]
                    chosen = _new_candidate((answer, offset, strides))
                    one = ((_new_box((request.logical_origin, request.shape)), chosen),)
                else:
                    for cand in request.candidates:
                        if cand.source_rank == answer:
                            one = ((_new_box((request.logical_origin, request.shape)), cand),)
                            break
                    else:  # not a holder: ``_candidate`` raises the error that says so
                        one = ((request.box, _candidate(index, request, answer, name)),)
                if sharing:
                    accepted[(id(request), answer)] = (request, one)
        elif _instance(answer, (list, tuple)):
            size = None if sizes is None else sizes[name]
            try:  # length first, so an enormous split is refused before anything iterates it
                parts = answer
                count = len(answer)
                if count <= budget.max_parts_per_request and type(answer) not in (list, tuple):
                    # An exact list or tuple is read by index up to this count (C-level reads, no
                    # copy: a million parts stay the policy's memory); anything else is copied once,
                    # one part past the budget at most, whatever its __len__ claimed.
                    parts = tuple(islice(answer, budget.max_parts_per_request + 1))
                    count = len(parts)
                if count > budget.max_parts_per_request:
                    what = f"{count} parts exceed max_parts_per_request={budget.max_parts_per_request}"
                    raise _fail(index, request, what, name)
            except InvalidReplicaPolicyError:
                raise
            except Exception as exc:
                raise _fail(index, request, f"the split cannot be read: {_exc_text(exc)}", name) from exc
            one = _check_split(index, request, parts, size, min_split_bytes, name, count)
        else:
            raise _fail(
                index,
                request,
                f"answer {describe(answer)} ({type_name(answer)}) is neither an int location nor a sequence "
                "of ReplicaPart",
                name,
            )
        resolved.append(one)
        n_parts = len(one)
        count = parts_per_parameter.get(name, 0) + n_parts
        parts_per_parameter[name] = count
        if n_parts > 1:
            split_parameters.add(name)
        # Only splits are the policy's doing: without one, too many segments is the layout's
        # budget problem, refused after coalescing as a plain AffineTransferError.
        if count > max_segments and name in split_parameters:
            what = f"splits make the answers need more than max_segments={budget.max_segments} segments"
            raise _fail(index, request, what, name)
    if len(resolved) != len(requests):  # the snapshot above makes this unreachable; kept as the invariant
        raise InvalidReplicaPolicyError(f"{len(resolved)} answers were checked for {len(requests)} requests")
    return resolved
