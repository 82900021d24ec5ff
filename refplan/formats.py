"""Every JSON file format of refplan: its name, its loader and its writer, in one module.

Batch files: many parameters' maps in one JSON document, and their plans.

Maps: ``{"format": "refplan.maps/1", "parameters": {name: {"target": <map>, "source": <map>}},
"endpoints"?: {"source": {loc: proc}, "target": {loc: proc}}, "process_node"?: {proc: node},
"element_size"?: bytes | {name: bytes}}``. Plans: ``{"format": "refplan.plans/1", "parameters":
{name: <plan dict>}}``. Map and plan dicts are DeepSpeed's, so either side may come from there.

The loaders are as strict as ``spec/schemas/*.json``: a key the format does not define is refused
at every level, with its JSON path and the nearest key the format does define, because a
misspelt optional key (``"endpoint"``) would otherwise be dropped silently and the file planned
as if it had never been given. A file that cannot be read at all is an ``InputFileError`` (an
``OSError``), not a map error.
"""

from __future__ import annotations

import codecs
import contextlib
import difflib
import io
import json
import os
import re
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

from . import limits
from ._gc import cycle_collection_paused
from .endpoints import TransferEndpoints
from .errors import InputFileError, InvalidMapError
from .maps import ParamAffineMap, describe, parse_int_key
from .plan import TransferPlan

_T = TypeVar("_T")

__all__ = [
    "KNOWN_FORMATS",
    "MAPS_FORMAT",
    "MAX_ELEMENT_SIZE",
    "PLANS_FORMAT",
    "MapsBatch",
    "PlansStream",
    "check_format",
    "check_keys",
    "dump_maps",
    "dump_plans",
    "load_json",
    "loads_json",
    "parse_endpoints",
    "parse_maps",
    "parse_plans",
    "path_key",
    "read_maps",
    "terminal_text",
    "xml_text",
]

MAPS_FORMAT = "refplan.maps/1"
"""The ``format`` of a maps file (``parse_maps``/``dump_maps``; ``spec/schemas/maps.schema.json``)."""

PLANS_FORMAT = "refplan.plans/1"
"""The ``format`` of a plans file (``parse_plans``/``dump_plans``; ``spec/schemas/plans.schema.json``)."""


@dataclass(frozen=True)
class MapsBatch:
    """A parsed maps file: ``pairs`` is name -> (target map, source map), as ``plan_transfers`` takes."""

    pairs: dict[str, tuple[ParamAffineMap, ParamAffineMap]]
    endpoints: TransferEndpoints | None = None
    process_node: dict[int, int] | None = None
    element_size: dict[str, int] | None = None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` for ``json``: refuse an object that names one key twice.

    Python's ``json`` keeps the last duplicate silently, so a maps file with two entries for one
    parameter or location would be read as only one of them, and two readers could disagree on
    which. RFC 8259 leaves the behaviour open; a planner must not guess.
    """
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return out


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _twice(key: str) -> str:
    return f"key {describe(key)} appears twice in one object"


_BOM = "it starts with a UTF-8 byte-order mark (BOM), which a JSON file must not have: save it without one"
"""What a file that starts with a BOM is told, by ``loads_json`` and the streaming reader alike
(Python's own text, "decode using utf-8-sig", names a codec where a user needs an action)."""


def _too_many_digits(exc: ValueError) -> str:
    """What an integer literal beyond ``sys.get_int_max_str_digits()`` is told (Python's text,
    cut to fit a line, ended mid-word: "... Exceeds the limit (4300 dig...gits() to increase")."""
    text = str(exc)
    if "integer string conversion" in text or "Exceeds the limit" in text:
        return f"an integer literal has more than {sys.get_int_max_str_digits()} digits"
    return describe(text)


def loads_json(text: str | bytes, where: str = "JSON") -> Any:
    """Parse JSON text, turning every way it can be malformed into ``InvalidMapError``.

    Covers syntax errors, invalid UTF-8, nesting deeper than the parser's recursion limit, integers
    with more digits than Python converts (``ValueError``) and duplicate keys in one object.
    ``NaN`` and ``Infinity`` parse (as Python's ``json`` does) and are refused later wherever an
    integer is required.
    """
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        raise InvalidMapError(f"{where}: not valid JSON: {_twice(exc.key)}") from None
    except json.JSONDecodeError as exc:
        raise InvalidMapError(f"{where}: not valid JSON: {_BOM if exc.msg.startswith('Unexpected UTF-8 BOM') else exc}"
                              ) from None
    except UnicodeDecodeError as exc:
        raise InvalidMapError(f"{where}: not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidMapError(f"{where}: not valid JSON: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer literal beyond sys.get_int_max_str_digits()
        raise InvalidMapError(f"{where}: not valid JSON: {_too_many_digits(exc)}") from None


STDIN = "-"
"""The input file name that means standard input (as ``-o -`` means standard output)."""


def open_input(path: str | Path, binary: bool = False) -> IO[Any]:
    """An input file opened for reading, ``-`` being standard input (a duplicate of its
    descriptor, so that closing the file leaves ``sys.stdin`` open). ``OSError`` as ``open``."""
    if os.fspath(path) == STDIN:
        try:
            fd = os.dup(sys.stdin.fileno())
        except (AttributeError, ValueError) as exc:  # closed (None), or a stream without a descriptor
            raise OSError(9, "standard input is closed or has no file descriptor") from exc
        return os.fdopen(fd, "rb") if binary else os.fdopen(fd, encoding="utf-8")
    return open(path, "rb") if binary else open(path, encoding="utf-8")


def load_json(path: str | Path) -> Any:
    """Read a JSON file (``-``: standard input): ``InputFileError`` if it cannot be read,
    ``InvalidMapError`` if it is not JSON.

    The two differ on purpose: a missing or unreadable file says nothing about any map, and a
    caller that treats ``InvalidMapError`` as "the checkpoint may be corrupt" must not be told so
    about a typo in a path.
    """
    try:
        with open_input(path) as handle:
            text = handle.read()
    except OSError as exc:
        raise InputFileError(f"{path}: cannot read: {exc.strerror or exc}", exc.errno) from None
    except UnicodeDecodeError as exc:
        raise InvalidMapError(f"{path}: not valid JSON: {exc}") from None
    return loads_json(text, str(path))


def _int_key(key: Any, where: str) -> int:
    """An integer object key: an int, or a decimal string of ASCII digits (surrounding spaces ok)."""
    value = parse_int_key(key)
    if value is not None:
        return value
    raise InvalidMapError(f"{where}: key {describe(key)} is not an integer")


def _int_table(value: Any, where: str) -> dict[int, int]:
    if not isinstance(value, Mapping):
        raise InvalidMapError(f"{where}: expected an object")
    out: dict[int, int] = {}
    for key, item in value.items():
        k = _int_key(key, where)
        if k in out:
            raise InvalidMapError(f"{where}: key {k} is listed twice")
        if isinstance(item, bool) or not isinstance(item, int):
            raise InvalidMapError(f"{path_key(where, key)}: {describe(item)} is not an integer")
        out[k] = item
    return out


KNOWN_FORMATS = {
    MAPS_FORMAT: "maps",
    PLANS_FORMAT: "plans",
    "refplan.conformance/1": "conformance cases",
    "refplan.conformance-input/1": "a conformance case's planner input",
}
"""Every ``format`` refplan writes, and what a file of it holds (for saying what a file is)."""


def check_format(doc: Any, expected: str) -> None:
    """Refuse a document that is not a ``expected`` file, saying what it is instead.

    A plans file given where maps are expected, a file of a later version and a file that is not
    refplan's at all each need a different fix, so each gets its own message (``InvalidMapError``,
    path ``$`` or ``$.format``) rather than one "expected format X".
    """
    what = KNOWN_FORMATS[expected]
    if not isinstance(doc, Mapping):
        found = "a list" if isinstance(doc, list) else f"a JSON {type(doc).__name__}"
        raise InvalidMapError(f"$: this is {found}, not a refplan file; {what} ({expected}) were expected")
    if "format" not in doc:
        if "logical_shape" in doc and ("ranks" in doc or "segments" in doc):
            one = "map" if "ranks" in doc else "plan"
            raise InvalidMapError(
                f"$: no \"format\" key: this is one {one} (DeepSpeed's dict form), not a refplan file; "
                f"{what} ({expected}) were expected"
            )
        raise InvalidMapError(f"$: no \"format\" key: not a refplan file; {what} ({expected}) were expected")
    found = doc["format"]
    if found == expected:
        return
    if isinstance(found, str) and found in KNOWN_FORMATS:
        raise InvalidMapError(f"$.format: this is a {found} file ({KNOWN_FORMATS[found]}); {what} were expected")
    family = expected.rsplit("/", 1)[0] + "/"
    if isinstance(found, str) and found.startswith(family):
        raise InvalidMapError(
            f"$.format: format {found!r} is not supported (this version reads {expected})"
        )
    raise InvalidMapError(f"$.format: {describe(found)} is not a refplan format; {what} ({expected}) were expected")


MAX_ELEMENT_SIZE = limits.MAX_ELEMENT_SIZE  # the one bound, stated in refplan.limits


# ---------------------------------------------------------------------------------------------
# Unknown keys. One walk over the document before parsing, so that every level is checked the
# same way and the error names a JSON path the user can find in the file.

_MAPS_FILE_KEYS = ("format", "parameters", "endpoints", "process_node", "element_size")
_PAIR_KEYS = ("target", "source")
_MAP_KEYS = ("logical_shape", "ranks")
_LOCATION_KEYS = ("shard_shape", "pieces")
_PIECE_KEYS = ("shape", "source", "dest", "locations", "scale")
_ENDPOINTS_KEYS = ("source", "target")
_PLANS_FILE_KEYS = ("format", "parameters")
_PLAN_KEYS = ("logical_shape", "segments")
_SEGMENT_KEYS = ("shape", "source", "target")
_PIECE_SET = frozenset(_PIECE_KEYS)
_SEGMENT_SET = frozenset(_SEGMENT_KEYS)
_PAIR_SET = frozenset(_PAIR_KEYS)
_MAP_SET = frozenset(_MAP_KEYS)
_LOCATION_SET = frozenset(_LOCATION_KEYS)
_PLAN_SET = frozenset(_PLAN_KEYS)
# One set test per object first; the JSON path of an object is written only for one that fails it
# (a file of 10⁵ parameters has ~10⁶ objects, and writing each path cost more than parsing them).


def path_key(path: str, key: Any) -> str:
    """``path`` extended by an object key: ``.name`` for identifiers, ``["..."]`` otherwise.

    The one JSON-path notation of every message (``$`` the root, ``[i]`` for list indices), so
    a path can be followed, or searched for, in the file it names."""
    text = str(key)
    if text.isidentifier() and text.isascii():
        return f"{path}.{text}"
    return f"{path}[{json.dumps(text)[:80]}]"


def _quote(text: str) -> str:
    """A key as JSON writes it (so it can be searched for in the file), bounded in length."""
    return json.dumps(text) if len(text) <= 80 else describe(text)


def _known(
    value: Any, path: str, allowed: tuple[str, ...] | frozenset[str], required: tuple[str, ...] = ()
) -> None:
    """Refuse a key of the object ``value`` outside ``allowed`` (and a missing ``required`` one).

    Non-objects are left alone: the parser that follows names the wrong type. ``allowed`` is a
    tuple for a format's few keys, a frozenset where the keys are data (a file's parameter names:
    membership in a tuple of 10⁵ names, once per name, was quadratic).
    """
    if not isinstance(value, Mapping):
        return
    for key in value:
        if key not in allowed:
            text = str(key)
            near = difflib.get_close_matches(text, allowed, n=1, cutoff=0.6)
            listed = ", ".join(allowed if isinstance(allowed, tuple) else sorted(allowed))
            many = len(allowed) > 16
            expected = f"; it is none of the {len(allowed)} names" if many else f"; expected one of {listed}"
            hint = f" (did you mean {json.dumps(near[0])}?)" if near else expected
            raise InvalidMapError(f"{path}: unknown key {_quote(text)}{hint}")
    for key in required:
        if key not in value:
            raise InvalidMapError(f"{path}: missing key {_quote(key)}")


def _check_map_keys(value: Any, where: Callable[[], str]) -> None:
    """The keys of one map and of its locations and pieces; ``where()`` is the map's JSON path."""
    if not isinstance(value, Mapping):
        return
    if not value.keys() <= _MAP_SET:
        _known(value, where(), _MAP_KEYS)
    ranks = value.get("ranks")
    if not isinstance(ranks, Mapping):
        return
    for key, location in ranks.items():
        if not isinstance(location, Mapping):
            continue
        if location.keys() != _LOCATION_SET:
            _known(location, path_key(f"{where()}.ranks", key), _LOCATION_KEYS, required=_LOCATION_KEYS)
        pieces = location.get("pieces")
        if isinstance(pieces, (list, tuple)):
            for i, piece in enumerate(pieces):
                if isinstance(piece, Mapping) and not piece.keys() <= _PIECE_SET:
                    _known(piece, f"{path_key(f'{where()}.ranks', key)}.pieces[{i}]", _PIECE_KEYS)


def _plan_path(name: Any) -> str:
    return "$" if name is None else path_key("$.parameters", name)


def _side_path(name: Any, side: str) -> Callable[[], str]:
    return lambda: f"{path_key('$.parameters', name)}.{side}"


def check_keys(doc: Any, kind: str) -> None:
    """Refuse any key of a ``kind`` document that its format does not define.

    ``kind`` is ``"maps"`` (a ``refplan.maps/1`` file), ``"plans"`` (a ``refplan.plans/1`` file),
    ``"map"`` / ``"plan"`` (one parameter's dict) or ``"endpoints"``. Raises ``InvalidMapError``
    naming the JSON path, the key and the nearest defined key; the set of keys is exactly the
    one ``spec/schemas/*.json`` allows.
    """
    if kind == "maps":
        _known(doc, "$", _MAPS_FILE_KEYS)
        if not isinstance(doc, Mapping):
            return
        params = doc.get("parameters")
        if isinstance(params, Mapping):
            for name, pair in params.items():
                if not isinstance(pair, Mapping):
                    continue
                if not pair.keys() <= _PAIR_SET:
                    _known(pair, path_key("$.parameters", name), _PAIR_KEYS)
                for side in _PAIR_KEYS:
                    _check_map_keys(pair.get(side), _side_path(name, side))
        check_keys(doc.get("endpoints"), "endpoints")
        sizes = doc.get("element_size")
        if isinstance(sizes, Mapping) and isinstance(params, Mapping):
            _known(sizes, "$.element_size", frozenset(str(n) for n in params))
    elif kind == "map":
        _check_map_keys(doc, lambda: "$")
    elif kind == "endpoints":
        _known(doc, "$.endpoints", _ENDPOINTS_KEYS)
    elif kind in ("plans", "plan"):
        plans: Any = {}
        if kind == "plans":
            _known(doc, "$", _PLANS_FILE_KEYS)
            plans = doc.get("parameters") if isinstance(doc, Mapping) else None
        else:
            plans = {None: doc}
        if not isinstance(plans, Mapping):
            return
        for name, plan in plans.items():
            if not isinstance(plan, Mapping):
                continue
            if not plan.keys() <= _PLAN_SET:
                _known(plan, _plan_path(name), _PLAN_KEYS)
            segments = plan.get("segments")
            if isinstance(segments, (list, tuple)):
                for i, seg in enumerate(segments):
                    if isinstance(seg, Mapping) and not seg.keys() <= _SEGMENT_SET:
                        _known(seg, f"{_plan_path(name)}.segments[{i}]", _SEGMENT_KEYS)
    else:
        raise ValueError(f"check_keys: unknown document kind {kind!r}")


def parse_endpoints(doc: Any, where: str = "$.endpoints") -> TransferEndpoints:
    """``{"source": {loc: proc}, "target": {loc: proc}}``, with integer keys and values.

    Stricter than ``TransferEndpoints.from_dict``: a location listed twice ("0" and "00") is
    refused instead of silently binding the later process, and keys must be ASCII decimal
    integers ("1_0" and non-ASCII digits are refused). ``where`` is the JSON path of ``doc``
    in its file (``$`` for an endpoints file of its own).
    """
    _known(doc, where, _ENDPOINTS_KEYS)  # check_keys(doc, "endpoints"), at this document's own path
    if not isinstance(doc, Mapping) or set(doc) != {"source", "target"}:
        raise InvalidMapError(f"{where}: expected {{\"source\": {{...}}, \"target\": {{...}}}}")
    return TransferEndpoints(_int_table(doc["source"], f"{where}.source"), _int_table(doc["target"], f"{where}.target"))


def read_endpoints(path: str | Path) -> TransferEndpoints:
    """Load and parse an endpoints file (``refplan plan --endpoints FILE``); every error names
    the file, then the JSON path from the file's own root (``$.target["3"]``), as ``read_maps``'s do."""
    doc = load_json(path)  # its own errors already name the file
    try:
        return parse_endpoints(doc, "$")
    except InvalidMapError as exc:
        raise InvalidMapError(f"{path}: {exc}") from None


def _names(value: Mapping[Any, Any], what: str) -> list[tuple[str, Any]]:
    """``(str(name), entry)`` pairs, refusing two keys that name the same parameter."""
    out: list[tuple[str, Any]] = []
    seen: set[str] = set()
    for name, entry in value.items():
        text = str(name)
        if text in seen:
            raise InvalidMapError(f"{what}: parameter {describe(text)} is listed twice")
        seen.add(text)
        out.append((text, entry))
    return out


def parse_maps(doc: Any, *, from_json: bool = False) -> MapsBatch:
    """A ``refplan.maps/1`` document; ``InvalidMapError`` for any key or value it does not define.

    ``element_size`` is one integer for every parameter, or an object naming each parameter.

    ``from_json``: the document came from ``load_json``/``loads_json``. Then every value is a
    plain JSON type, whose ``repr`` is equal exactly when the values are (types and key order
    included), so a map whose ``repr`` equals an earlier one's is that map, parsed once. Models
    repeat layouts (an MoE file of 10⁵ expert weights holds a few dozen distinct maps), and
    parsing a map field by field costs ~20x its ``repr``. Only maps that parsed are remembered,
    so each error still names its own parameter. A Python document may hold objects whose
    ``repr`` hides a difference (an ``int`` subclass, say): without ``from_json`` every map is
    parsed on its own.
    """
    check_format(doc, MAPS_FORMAT)
    check_keys(doc, "maps")
    params = doc.get("parameters")
    if not isinstance(params, Mapping):
        raise InvalidMapError("$.parameters: must be an object of name -> {target, source}")
    pairs: dict[str, tuple[ParamAffineMap, ParamAffineMap]] = {}
    parsed: dict[str, ParamAffineMap] = {}

    def parse(value: Any, name: str, side: str) -> ParamAffineMap:
        return _parsed_once(parsed if from_json else None, value, ParamAffineMap.from_dict, "{}." + side, name)

    for name, entry in _names(params, "$.parameters"):
        if not isinstance(entry, Mapping) or "target" not in entry or "source" not in entry:
            raise InvalidMapError(f"{path_key('$.parameters', name)}: needs \"target\" and \"source\" maps")
        pairs[name] = (parse(entry["target"], name, "target"), parse(entry["source"], name, "source"))
    # An optional key is absent or holds its value: ``null`` is refused, as the schema refuses it
    # (a file that writes ``"endpoints": null`` means something, and it is not "no endpoints").
    for key in ("endpoints", "process_node", "element_size"):
        if key in doc and doc[key] is None:
            raise InvalidMapError(f"$.{key}: null is not allowed; leave the key out for none")
    endpoints = parse_endpoints(doc["endpoints"]) if "endpoints" in doc else None
    process_node = _int_table(doc["process_node"], "$.process_node") if "process_node" in doc else None
    element_size = _element_size(doc.get("element_size"), pairs)
    return MapsBatch(pairs, endpoints, process_node, element_size)


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _too_large(size: int, where: str) -> InvalidMapError:
    return InvalidMapError(
        f"{where}: {size} bytes per element is above the largest element size, {MAX_ELEMENT_SIZE} bytes"
    )


def _element_size(raw: Any, pairs: Mapping[str, Any]) -> dict[str, int] | None:
    """``element_size`` of a maps file: one int for every parameter, or name -> int for each."""
    if raw is None:
        return None
    if _positive_int(raw):
        if raw > MAX_ELEMENT_SIZE:
            raise _too_large(raw, "$.element_size")
        return dict.fromkeys(pairs, int(raw))
    if not isinstance(raw, Mapping) or not all(_positive_int(v) for v in raw.values()):
        raise InvalidMapError(
            f"$.element_size: expected positive integer bytes, for every parameter (2) or per parameter "
            f"({{\"name\": 2}}), got {describe(raw)}"
        )
    sizes = {name: int(v) for name, v in _names(raw, "$.element_size")}
    for name, size in sizes.items():
        if size > MAX_ELEMENT_SIZE:
            raise _too_large(size, path_key("$.element_size", name))
    missing = [name for name in pairs if name not in sizes]
    if missing:
        raise InvalidMapError(f"$.element_size: no size for parameter {describe(missing[0])}")
    return sizes


def dump_maps(batch: MapsBatch) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "format": MAPS_FORMAT,
        "parameters": {
            name: {"target": t.to_dict(), "source": s.to_dict()} for name, (t, s) in sorted(batch.pairs.items())
        },
    }
    if batch.endpoints is not None:
        doc["endpoints"] = batch.endpoints.to_dict()
    if batch.process_node is not None:
        doc["process_node"] = {str(k): v for k, v in sorted(batch.process_node.items())}
    if batch.element_size is not None:
        doc["element_size"] = dict(sorted(batch.element_size.items()))
    return doc


def parse_plans(doc: Any, *, from_json: bool = False) -> dict[str, TransferPlan]:
    """A ``refplan.plans/1`` document as plans by name.

    ``from_json``: the document came from ``load_json``/``loads_json``, so a plan whose ``repr``
    equals an earlier one's is parsed once (plans of a model repeat as its layouts do; the
    argument is ``parse_maps``'s).
    """
    check_format(doc, PLANS_FORMAT)
    params = doc.get("parameters")
    if not isinstance(params, Mapping):
        raise InvalidMapError("$.parameters: must be an object of name -> plan")
    check_keys(doc, "plans")
    parsed: dict[str, TransferPlan] = {}
    return {
        name: _parsed_once(parsed if from_json else None, entry, TransferPlan.from_dict, "{}", name)
        for name, entry in _names(params, "$.parameters")
    }


def _parsed_once(
    parsed: dict[str, _T] | None, value: Any, parse: Callable[[Any, str], _T], where: str, name: str
) -> _T:
    """``parse(value, where)`` with ``where`` naming entry ``name`` (``where.format(path)``, the
    entry's JSON path ``$.parameters.<name>``), once per distinct ``value`` when ``parsed``
    remembers them (``from_json``); the path is written only for a value that is parsed.

    The key is ``repr(value)``: for plain JSON values it is equal exactly when the values are
    (it tells ``1`` from ``1.0`` and ``true``, keeps key order, and runs in C). Only values that
    parsed are remembered, so each error is raised, and named, for its own entry; a value nested
    too deeply to ``repr`` is parsed on its own.
    """
    def fresh() -> _T:
        return parse(value, where.format(path_key("$.parameters", name)))

    if parsed is None:
        return fresh()
    try:
        text = repr(value)
    except RecursionError:
        return fresh()
    found = parsed.get(text)
    if found is None:
        found = parsed[text] = fresh()
    return found


def dump_plans(plans: Mapping[str, TransferPlan]) -> dict[str, Any]:
    return {"format": PLANS_FORMAT, "parameters": {name: plans[name].to_dict() for name in sorted(plans)}}


def read_maps(path: str | Path) -> MapsBatch:
    """Load and parse a maps file; every error names the file, then the JSON path and the problem.

    The cyclic collector is paused meanwhile (issue 27): a 2·10⁵-piece file makes millions of
    lists, dicts and pieces, none in a cycle, and the collector re-scanning them was about 60 %
    of reading it (2.7 s of 4.4). Results are unaffected; the planner and the oracle do the same.
    """
    with cycle_collection_paused():
        doc = load_json(path)  # its own errors already name the file
        try:
            return parse_maps(doc, from_json=True)
        except InvalidMapError as exc:
            raise InvalidMapError(f"{path}: {exc}") from None


# ---------------------------------------------------------------------------------------------
# Streaming a plans file. ``load_json`` holds the whole text and then the whole document (about
# 1.3 KB of Python objects per segment); ``PlansStream`` holds one parameter's plan at a time.
# It reads the file in chunks, walks the top-level object and the ``parameters`` object itself,
# and hands each value to ``json``'s own decoder (``raw_decode``), so values are parsed by the
# same code as ``load_json``'s. What it must add is what ``json.loads`` does between values, and
# it does it the same way, so that a malformed file is refused with the same message: the same
# punctuation errors at the same line, column and character, duplicate keys refused when their
# object closes (``_unique_keys`` runs then), ``Extra data`` after the document, a UTF-8 BOM,
# and undecodable bytes anywhere in the file taking precedence over every JSON error (``load_json``
# decodes the whole file before parsing it). tests/test_verify_stream.py holds the two readers to
# the same answers on valid, truncated and corrupted files.

_WHITESPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder(object_pairs_hook=_unique_keys)
_SETTLED = 64
"""A decode error this many characters or more before the end of the text read so far is the
file's own: ``json`` reports an error where the text first stops being a valid prefix (strings
aside: an unterminated one is reported at its start), and at most a ``\\uXXXX\\uXXXX`` escape
(12 characters) lies between what it examined and where it reports."""


def _trailing_comma_rule() -> tuple[str, bool]:
    """How this Python's ``json`` reports ``{"a": 0, }``: its message, and whether at the comma.

    Python 3.13 added "Illegal trailing comma before end of object" at the comma; older ones say
    "Expecting property name enclosed in double quotes" at the ``}``. Asked of ``json`` itself, so
    the stream says what ``load_json`` says on whichever Python runs it.
    """
    try:
        json.loads('{"a": 0, }')
    except json.JSONDecodeError as exc:
        return exc.msg, exc.pos == 7
    raise AssertionError("json accepted a trailing comma")  # pragma: no cover


_TRAILING_COMMA, _TRAILING_AT_COMMA = _trailing_comma_rule()


class _Text:
    """A file's text, decoded in chunks exactly as ``load_json`` decodes it whole (UTF-8, strict,
    universal newlines), keeping only what is not consumed yet plus the counts that turn a
    position in it back into the whole file's line, column and character."""

    def __init__(self, path: str | Path, chunk: int) -> None:
        self.path = path
        self.chunk = chunk
        try:
            self.handle = open_input(path, binary=True)  # closed by close(), also on errors
        except OSError as exc:
            raise InputFileError(f"{path}: cannot read: {exc.strerror or exc}", exc.errno) from None
        self.decoder = io.IncrementalNewlineDecoder(codecs.getincrementaldecoder("utf-8")(), translate=True)
        self.fed = 0  # bytes given to the decoder
        self.text = ""  # text[pos:] is not consumed yet
        self.pos = 0
        self.base = 0  # characters dropped before text[0]
        self.lines = 0  # line breaks among them
        self.line_start = 0  # absolute index of the character after the last of them
        self.eof = False

    def close(self) -> None:
        self.handle.close()

    def _decode(self, data: bytes, final: bool) -> str:
        try:
            text: str = self.decoder.decode(data, final)
        except UnicodeDecodeError as exc:
            start = self.fed - (len(exc.object) - len(data)) + exc.start
            end = start + exc.end - exc.start
            what = (
                f"byte 0x{exc.object[exc.start]:02x} in position {start}" if end == start + 1
                else f"bytes in position {start}-{end - 1}"
            )
            raise InvalidMapError(
                f"{self.path}: not valid JSON: '{exc.encoding}' codec can't decode {what}: {exc.reason}"
            ) from None
        self.fed += len(data)
        return text

    def _read(self) -> str:
        try:
            data = self.handle.read(self.chunk)
        except OSError as exc:
            raise InputFileError(f"{self.path}: cannot read: {exc.strerror or exc}", exc.errno) from None
        if not data:
            self.eof = True
        return self._decode(data, not data)

    def more(self) -> None:
        """Drop the consumed text and read at least as much again as is left (so that a value
        retried after each read costs amortized linear time), or to the end of the file."""
        self._drop_consumed()
        want = max(self.chunk, len(self.text))
        parts = [self.text]
        got = 0
        while got < want and not self.eof:
            part = self._read()
            parts.append(part)
            got += len(part)
        self.text = "".join(parts)

    def _drop_consumed(self) -> None:
        """Forget ``text[:pos]``, counting its line breaks for later error positions."""
        if self.pos:
            self.lines += self.text.count("\n", 0, self.pos)
            newline = self.text.rfind("\n", 0, self.pos)
            if newline >= 0:
                self.line_start = self.base + newline + 1
            self.base += self.pos
            self.text = self.text[self.pos:]
            self.pos = 0

    def fail(self, message: str) -> InvalidMapError:
        """The error for a file that is not JSON, after reading the rest: an undecodable byte
        later in the file is what ``load_json`` reports instead (it decodes before it parses)."""
        while not self.eof:
            self._read()
        return InvalidMapError(f"{self.path}: not valid JSON: {message}")

    def fail_at(self, message: str, at: int) -> InvalidMapError:
        """``fail`` for ``json``'s ``message`` at ``text[at]``, placed as ``JSONDecodeError`` places it."""
        lineno = self.lines + self.text.count("\n", 0, at) + 1
        newline = self.text.rfind("\n", 0, at)
        colno = at - newline if newline >= 0 else self.base + at - self.line_start + 1
        return self.fail(f"{message}: line {lineno} column {colno} (char {self.base + at})")

    def peek(self) -> str:
        """The next character, or "" at the end of the file."""
        while self.pos >= len(self.text) and not self.eof:
            self.more()
        return self.text[self.pos:self.pos + 1]

    def skip(self) -> None:
        """Skip JSON white space (``json``'s own set), reading on while it lasts."""
        while True:
            match = _WHITESPACE.match(self.text, self.pos)
            assert match is not None
            self.pos = match.end()
            if self.pos < len(self.text) or self.eof:
                return
            self.more()

    def value(self, *, release: bool = False) -> Any:
        """Decode the JSON value at ``pos`` with ``json``'s decoder; read on while the text so far
        may end inside it. ``release`` drops the value's text once decoded if it is large."""
        too_long = ""
        while True:
            try:
                value, end = _DECODER.raw_decode(self.text, self.pos)
            except json.JSONDecodeError as exc:
                settled = exc.pos < len(self.text) - _SETTLED and not exc.msg.startswith("Unterminated string")
                if self.eof or settled:
                    raise self.fail_at(exc.msg, exc.pos) from None
            except _DuplicateKey as exc:  # an object inside the value closed: the file's own
                raise self.fail(_twice(exc.key)) from None
            except RecursionError:
                raise self.fail("nested too deeply") from None
            except ValueError as exc:
                # Too many digits in an integer; the count in the message may still grow with
                # the next chunk, and is final once more text leaves it unchanged.
                if self.eof or str(exc) == too_long:
                    raise self.fail(_too_many_digits(exc)) from None
                too_long = str(exc)
            else:
                if end < len(self.text) or self.eof:  # a number or literal may go on in the next chunk
                    self.pos = end
                    if release and end >= self.chunk:
                        self._drop_consumed()
                    return value
            self.more()

    def members(self) -> Iterator[str]:
        """Walk the object whose ``{`` is at ``pos`` as ``json`` does: yield each key with ``pos``
        at its value, which the caller consumes before the next key; refuse a key given twice
        when the object closes, where ``_unique_keys`` refuses it."""
        self.pos += 1
        self.skip()
        seen: set[str] = set()
        twice: str | None = None
        if self.peek() != "}":
            while True:
                if self.peek() != '"':
                    raise self.fail_at("Expecting property name enclosed in double quotes", self.pos)
                key = self.value()
                self.skip()
                if self.peek() != ":":
                    raise self.fail_at("Expecting ':' delimiter", self.pos)
                self.pos += 1
                self.skip()
                if twice is None and key in seen:
                    twice = key
                seen.add(key)
                yield key
                self.skip()
                if self.peek() == "}":
                    break
                if self.peek() != ",":
                    raise self.fail_at("Expecting ',' delimiter", self.pos)
                comma = self.pos
                self.pos += 1
                self.skip()
                if self.peek() == "}" and _TRAILING_AT_COMMA:
                    raise self.fail_at(_TRAILING_COMMA, comma)
        self.pos += 1
        if twice is not None:
            raise self.fail(_twice(twice))


class PlansStream:
    """A ``refplan.plans/1`` file read one parameter at a time: iterate for ``(name, TransferPlan)``.

    For files too large to hold as one document (``refplan verify`` streams from
    ``limits.STREAM_PLANS_BYTES``). Each plan is parsed and yielded as soon as its entry has been
    read, and nothing of it is kept afterwards, so memory follows the largest parameter rather than
    the file. The answer is ``load_json`` + ``parse_plans``'s: every error they raise is raised
    here, with the same class and message, and the precedence they give it, which is why the
    iteration ends with the error rather than at it. A JSON error is raised where it is found (the
    rest of the file is only checked to decode); every other error (the ``format``, which may
    come after ``parameters``; an unknown key; a malformed plan) is known to win only once the
    whole file has been read, so plans stop being yielded at the first of them and it is raised
    at the end. Consumers must therefore treat what they received as provisional until the
    iteration has finished without an error. One corner is not the same: ``json`` gives up on
    nesting ("nested too deeply") at a depth that depends on the call stack, and an entry is
    decoded on its own, two levels shallower than in the whole document, so a file nested within
    a few levels of Python's recursion limit may be refused for its nesting by one reader and for
    its structure by the other (exit 2 either way; no plan nests deeper than four levels).

    A document that is not an object, or that is a bare plan (``segments`` and no ``format``,
    which ``refplan verify`` accepts for one parameter), is not a plans batch: after iterating,
    ``streamed`` is ``False`` and ``document`` holds it (a non-object read whole with
    ``load_json``; a bare plan with a placeholder ``{}`` for any ``parameters`` it names, whose
    entries were yielded), for the caller to handle as it handles ``load_json``'s result.
    """

    def __init__(self, path: str | Path, *, chunk: int = 1 << 20) -> None:
        if chunk < 1:
            raise ValueError("PlansStream: chunk must be positive")
        self.path = path
        self.chunk = chunk
        self.streamed = True
        self.document: Any = None

    def __iter__(self) -> Iterator[tuple[str, TransferPlan]]:
        key_error: InvalidMapError | None = None
        plan_error: InvalidMapError | None = None
        for name, entry in self._entries():
            if key_error is None:
                try:
                    check_keys({"format": PLANS_FORMAT, "parameters": {name: entry}}, "plans")
                except InvalidMapError as exc:
                    key_error = exc
            if key_error is None and plan_error is None:
                try:
                    plan = TransferPlan.from_dict(entry, path_key("$.parameters", name))
                except InvalidMapError as exc:
                    plan_error = exc
                else:
                    del entry  # the consumer holds only the parsed plan
                    yield name, plan
                    del plan
        header = self.document
        if not self.streamed:
            return
        if "format" not in header and "segments" in header:  # a bare plan: the caller's case
            self.streamed = False
            return
        parse_plans(header)  # the file-level errors, which come first
        if key_error is not None:
            raise key_error
        if plan_error is not None:
            raise plan_error

    def _entries(self) -> Iterator[tuple[str, Any]]:
        """``(name, entry)`` of the ``parameters`` object, in file order; the other top-level
        values, in order, end up in ``document`` (``{}`` for a streamed ``parameters``)."""
        text = _Text(self.path, self.chunk)
        try:
            text.more()
            if text.text.startswith("\ufeff"):
                raise text.fail(_BOM)
            text.skip()
            if text.peek() != "{":
                text.close()
                self.streamed = False
                self.document = load_json(self.path)
                return
            header: dict[str, Any] = {}
            for key in text.members():
                if key == "parameters" and text.peek() == "{":
                    header[key] = {}
                    for name in text.members():
                        yield name, text.value(release=True)  # bound to no name here: the consumer owns it
                else:
                    header[key] = text.value()
            text.skip()
            if text.peek():
                raise text.fail_at("Extra data", text.pos)
            self.document = header
        finally:
            text.close()


_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


_NOT_TERMINAL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _escaped(match: re.Match[str]) -> str:
    return ascii(match.group())[1:-1]


def terminal_text(text: str) -> str:
    """``text`` with control characters as their Python escapes, as ``xml_text`` writes what XML
    cannot hold: a planner's message reaches the terminal, and an ANSI sequence in it (a
    clear-screen, a colour) acted on the terminal (an outside probe). Tabs and newlines stay."""
    return _NOT_TERMINAL.sub(_escaped, text)


def xml_text(text: str) -> str:
    """``text`` with every character XML 1.0 cannot hold written as its Python escape (``\\x01``,
    ``\\ud800``), for reports written as XML (``refplan verify --junit``, ``refplan show --svg``).

    A parameter name is any JSON string: control characters and lone surrogates are valid there.
    ElementTree writes the former into an attribute unescaped (a file no XML reader accepts) and a
    UTF-8 writer refuses the latter (a traceback after the verdict was reached). The escape is
    Python's own ``ascii`` form, so the name reads as the JSON file's reader would print it.
    """
    return _NOT_XML.sub(_escaped, text)


def output_file_name(text: str) -> str:
    """An output file option's value, as an ``argparse`` ``type``: refused at once if empty.

    ``-o ''`` (an unset shell variable) was taken for the current folder and said "cannot write :
    Is a directory" after the whole job had run; it is the caller's mistake, named as one (exit 2).
    """
    if text == "":
        import argparse

        raise argparse.ArgumentTypeError("the file name is empty")
    return text


def unwritable(path: str | os.PathLike[str]) -> str | None:
    """Why ``write_file`` could not write ``path`` (``"cannot write P: reason"``), or None when it
    looks writable; asked before a long run, so that a result is not computed and then thrown
    away for a typo in an output path (an outside probe: ``verify --junit /nonexistent/x.xml``
    printed only the write error and turned exit 1 into 2). ``-`` is always writable. A check,
    not a promise: the write itself still reports what it meets. It asks what ``write_file`` will
    need: a file that is not a regular one (``/dev/stdout``, a pipe) written in place, else a
    temporary file in the target's folder (a link's target's), renamed over it."""
    name = os.fspath(path)
    if name == STDIN:
        return None
    try:
        kind = os.stat(name).st_mode
        special = not stat.S_ISREG(kind) and not stat.S_ISDIR(kind)
    except OSError:
        special = False
    if special:
        return None if os.access(name, os.W_OK) else f"cannot write {name}: Permission denied"
    target = os.path.realpath(name) if os.path.islink(name) else name
    if os.path.isdir(target):
        return f"cannot write {name}: Is a directory"
    folder = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(folder):
        return f"cannot write {name}: No such file or directory"
    if not os.access(folder, os.W_OK):
        return f"cannot write {name}: Permission denied"
    return None


def stdout_gone() -> None:
    """Standard output's reader went away (``| head``): point the descriptor at ``os.devnull``,
    so that the interpreter's flush at exit does not fail again on what is still buffered."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError):  # no descriptor (a replaced sys.stdout): nothing is flushed to a pipe
        pass


def write_text_file(path: str | os.PathLike[str], text: str) -> None:
    """``write_file`` of ``text`` in UTF-8."""
    write_file(path, text.encode("utf-8"))


def write_file(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all: into a temporary file beside it,
    then renamed over it, so a run that fails while writing (a full disk, a signal) leaves the
    earlier file as it was, never a truncated one a later reader takes for a result.

    A path that is not a regular file (``/dev/stdout``, a pipe) is written in place, where no
    rename is possible; a symbolic link's target is replaced, not the link. The new file gets the
    old one's permissions, or the umask's. ``OSError`` as ``open`` raises it, naming the path.
    ``-`` is standard output, as for ``-o -``.

    Whether the path is a regular file is asked of the path itself (``os.stat`` follows links):
    ``/dev/stdout`` into a pipe resolves to ``/proc/PID/fd/pipe:[N]``, which no path reaches, so
    resolving it first said "No such file or directory" (an outside review).
    """
    if os.fspath(path) == STDIN:
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    try:
        kind = os.stat(path).st_mode
        special = not stat.S_ISREG(kind) and not stat.S_ISDIR(kind)
    except OSError:  # missing (or a dangling link): made below, and its error named there
        special = False
    if special:
        with open(path, "wb") as handle:
            handle.write(data)
        return
    target = os.path.realpath(os.fspath(path)) if os.path.islink(path) else os.fspath(path)
    if os.path.isdir(target):
        raise IsADirectoryError(21, "Is a directory", os.fspath(path))
    folder = os.path.dirname(target) or "."
    try:
        handle_fd, temporary = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(target)}.", suffix=".part")
    except OSError as exc:  # a missing folder, no permission: named by the caller's path
        exc.filename = os.fspath(path)
        raise
    try:
        with os.fdopen(handle_fd, "wb") as handle:
            try:
                mode = os.stat(target).st_mode & 0o7777
            except FileNotFoundError:
                mask = os.umask(0)
                os.umask(mask)
                mode = 0o666 & ~mask
            os.fchmod(handle.fileno(), mode)
            handle.write(data)
        os.replace(temporary, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if isinstance(exc, OSError):  # named by the caller's path, never the temporary file's
            exc.filename = os.fspath(path)
        raise
