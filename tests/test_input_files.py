"""Input files are as strict as the schemas, and the loaders and ``spec/schemas`` agree (issue 14).

A misspelt optional key used to be dropped silently (``"endpoint"`` planned without endpoints and
exited 0), an extra piece key passed, and a missing or unreadable file was an ``InvalidMapError``.
Every shipped example and every bad document below is judged by both the loader and the schema,
and the two must give the same answer.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from refplan.cli import main as cli_main
from refplan.errors import InputFileError, InvalidMapError
from refplan.files import check_keys, load_json, parse_maps, parse_plans

jsonschema = pytest.importorskip("jsonschema")
referencing = pytest.importorskip("referencing")

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "spec" / "examples"


def _validator(schema_id: str, definition: str) -> Any:
    schemas = [json.loads(p.read_text(encoding="utf-8")) for p in sorted((ROOT / "spec" / "schemas").glob("*.json"))]
    registry = referencing.Registry().with_resources(
        [(s["$id"], referencing.Resource.from_contents(s)) for s in schemas]
    )
    return jsonschema.Draft202012Validator({"$ref": f"{schema_id}#/$defs/{definition}"}, registry=registry)


MAPS_SCHEMA = _validator("urn:refplan:schema:maps", "mapsFile")
PLANS_SCHEMA = _validator("urn:refplan:schema:plans", "plansFile")


def _maps() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((EXAMPLES / "maps.json").read_text(encoding="utf-8"))
    return doc


def _plans() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((EXAMPLES / "plans.json").read_text(encoding="utf-8"))
    return doc


def _first(doc: dict[str, Any]) -> str:
    return sorted(doc["parameters"])[0]


def _loader_refuses(parse: Callable[[Any], Any], doc: Any) -> str | None:
    try:
        parse(doc)
    except InvalidMapError as exc:
        return str(exc)
    return None


def _edit(doc: dict[str, Any], change: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    change(out)
    return out


def _target_rank(d: dict[str, Any]) -> dict[str, Any]:
    rank: dict[str, Any] = d["parameters"][_first(d)]["target"]["ranks"]["0"]
    return rank


def _rename(table: dict[str, Any], old: str, new: str) -> None:
    table[new] = table.pop(old)


# name -> (change to the example maps file, key the error must name, its near miss or None)
BAD_MAPS: dict[str, tuple[Callable[[dict[str, Any]], Any], str, str | None]] = {
    "endpoint instead of endpoints": (lambda d: _rename(d, "endpoints", "endpoint"), "endpoint", "endpoints"),
    "element_sizes at the top": (lambda d: _rename(d, "element_size", "element_sizes"), "element_sizes",
                                 "element_size"),
    "extra key in a pair": (lambda d: d["parameters"][_first(d)].update(dtype="bf16"), "dtype", None),
    "map key misspelt": (lambda d: _rename(d["parameters"][_first(d)]["source"], "ranks", "rank"), "rank", "ranks"),
    "shard_shap": (lambda d: _rename(_target_rank(d), "shard_shape", "shard_shap"), "shard_shap", "shard_shape"),
    "extra piece key": (lambda d: _target_rank(d)["pieces"][0].update(note="x"), "note", None),
    "piece key misspelt": (lambda d: _rename(_target_rank(d)["pieces"][0], "locations", "location"), "location",
                           "locations"),
    "endpoints side misspelt": (lambda d: _rename(d["endpoints"], "target", "targets"), "targets", "target"),
}


def test_the_example_maps_file_uses_every_optional_key() -> None:
    """The bad files above are edits of the example, so it must have every key they edit."""
    assert {"endpoints", "process_node", "element_size"} <= set(_maps())


@pytest.mark.parametrize("what", sorted(BAD_MAPS))
def test_unknown_maps_keys_are_refused_by_loader_and_schema_alike(what: str) -> None:
    change, key, near = BAD_MAPS[what]
    doc = _edit(_maps(), change)
    assert list(MAPS_SCHEMA.iter_errors(doc)), f"the schema accepts {what}"
    message = _loader_refuses(parse_maps, doc)
    assert message is not None, f"the loader accepts {what}"
    assert "$" in message and key in message, message  # the JSON path and the key
    if near is not None:
        assert f'did you mean "{near}"' in message, message


@pytest.mark.parametrize("what", ["extra plan key", "segment key misspelt", "extra top-level key"])
def test_unknown_plans_keys_are_refused_by_loader_and_schema_alike(what: str) -> None:
    changes: dict[str, Callable[[dict[str, Any]], Any]] = {
        "extra plan key": lambda d: d["parameters"][_first(d)].update(statistics={}),
        "segment key misspelt": lambda d: _rename(d["parameters"][_first(d)]["segments"][0], "target", "tagret"),
        "extra top-level key": lambda d: d.update(version=1),
    }
    doc = _edit(_plans(), changes[what])
    assert list(PLANS_SCHEMA.iter_errors(doc))
    message = _loader_refuses(parse_plans, doc)
    assert message is not None and "unknown key" in message and "$" in message, message


def test_a_missing_shard_shape_key_is_refused_by_both() -> None:
    doc = _edit(_maps(), lambda d: _target_rank(d).pop("shard_shape"))
    assert list(MAPS_SCHEMA.iter_errors(doc))
    message = _loader_refuses(parse_maps, doc)
    assert message is not None and "shard_shape" in message


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.json")), ids=lambda p: p.name)
def test_every_shipped_example_is_accepted_by_loader_and_schema_alike(path: Path) -> None:
    doc = json.loads(path.read_text(encoding="utf-8"))
    if doc.get("format") == "refplan.maps/1":
        assert not list(MAPS_SCHEMA.iter_errors(doc))
        parse_maps(doc)
    elif doc.get("format") == "refplan.plans/1":
        assert not list(PLANS_SCHEMA.iter_errors(doc))
        parse_plans(doc)
    else:
        assert doc.get("format") == "refplan.conformance/1", path


def test_a_single_element_size_applies_to_every_parameter() -> None:
    doc = _edit(_maps(), lambda d: d.update(element_size=2))
    assert not list(MAPS_SCHEMA.iter_errors(doc))
    batch = parse_maps(doc)
    assert batch.element_size == dict.fromkeys(batch.pairs, 2)


@pytest.mark.parametrize("bad", [0, -2, True, "2", [2], {"w": 0}])
def test_bad_element_sizes_are_refused_by_loader_and_schema_alike(bad: Any) -> None:
    doc = _edit(_maps(), lambda d: d.update(element_size=bad))
    assert list(MAPS_SCHEMA.iter_errors(doc)), bad
    message = _loader_refuses(parse_maps, doc)
    assert message is not None and "element_size" in message, bad


def test_a_float_element_size_is_refused_by_the_loader() -> None:
    """JSON Schema's "integer" admits 2.0 (a number with no fraction); the loader is stricter, as
    it is for every integer field, so that no float ever reaches address arithmetic."""
    message = _loader_refuses(parse_maps, _edit(_maps(), lambda d: d.update(element_size=2.0)))
    assert message is not None and "element_size" in message


def test_an_element_size_table_must_name_every_parameter_and_no_other() -> None:
    """Cross-references a JSON schema cannot state (its description does): the loader checks them."""
    doc = _edit(_maps(), lambda d: d.update(element_size={_first(d): 2}))
    message = _loader_refuses(parse_maps, doc)
    assert message is not None and "element_size" in message
    doc = _edit(_maps(), lambda d: d["element_size"].update({_first(d) + "x": 2}))
    message = _loader_refuses(parse_maps, doc)
    assert message is not None and "$.element_size" in message and f'did you mean "{_first(doc)}"' in message


def test_check_keys_refuses_an_unknown_document_kind() -> None:
    with pytest.raises(ValueError, match="kind"):
        check_keys({}, "mapz")


def test_unreadable_files_are_input_file_errors_not_map_errors(tmp_path: Path) -> None:
    for path in (tmp_path / "absent.json", tmp_path):
        with pytest.raises(InputFileError, match="cannot read") as info:
            load_json(path)
        assert not isinstance(info.value, InvalidMapError)
        assert isinstance(info.value, OSError) and info.value.errno is not None


def _cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main(argv)
    assert "Traceback" not in err.getvalue()
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("command", ["plan", "verify", "show"])
def test_cli_refuses_a_misspelt_key_with_exit_2(command: str, tmp_path: Path) -> None:
    maps = tmp_path / "maps.json"
    maps.write_text(json.dumps(_edit(_maps(), BAD_MAPS["endpoint instead of endpoints"][0])), encoding="utf-8")
    argv = [command, str(maps)] + ([str(EXAMPLES / "plans.json")] if command == "verify" else [])
    code, _out, err = _cli(argv)
    assert code == 2, err
    assert "endpoint" in err and 'did you mean "endpoints"' in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("command", ["plan", "verify", "show"])
def test_cli_names_a_missing_file_as_unreadable(command: str, tmp_path: Path) -> None:
    argv = [command, str(tmp_path / "absent.json")] + ([str(EXAMPLES / "plans.json")] if command == "verify" else [])
    code, _out, err = _cli(argv)
    assert code == 2 and "cannot read" in err and "InvalidMapError" not in err, err


def test_cli_verify_refuses_an_unknown_key_in_a_bare_plan(tmp_path: Path) -> None:
    maps = _maps()
    name = _first(maps)
    single = {"format": "refplan.maps/1", "parameters": {name: maps["parameters"][name]}}
    plan = dict(_plans()["parameters"][name], extra=1)
    (tmp_path / "m.json").write_text(json.dumps(single), encoding="utf-8")
    (tmp_path / "p.json").write_text(json.dumps(plan), encoding="utf-8")
    code, _out, err = _cli(["verify", str(tmp_path / "m.json"), str(tmp_path / "p.json")])
    assert code == 2 and "extra" in err, err


def _twins(count: int) -> dict[str, Any]:
    """A maps document whose parameters all carry the example's first map pair, as JSON copies."""
    doc = _maps()
    first = doc["parameters"][_first(doc)]
    doc["parameters"] = {f"p{i}": json.loads(json.dumps(first)) for i in range(count)}
    doc.pop("element_size", None)
    return doc


def test_maps_parsed_once_per_text_equal_maps_parsed_one_by_one() -> None:
    """``from_json`` parses identical map texts once; the result equals parsing every map, and a
    twin that differs in one value (or only in its type: 4 against 4.0) is parsed on its own."""
    doc = _twins(4)
    target = doc["parameters"]["p2"]["target"]
    rank = next(iter(target["ranks"]))
    target["ranks"][rank]["pieces"][0]["dest"][0] += 0  # the same value, a fresh list
    doc["parameters"]["p3"]["source"]["logical_shape"] = list(doc["parameters"]["p3"]["source"]["logical_shape"])
    fast = parse_maps(json.loads(json.dumps(doc)), from_json=True)
    slow = parse_maps(json.loads(json.dumps(doc)))
    assert fast.pairs == slow.pairs
    assert fast.pairs["p0"][0] is fast.pairs["p1"][0]  # parsed once, shared
    shape = doc["parameters"]["p3"]["target"]["logical_shape"]
    doc["parameters"]["p3"]["target"]["logical_shape"] = [shape[0] + 1, *shape[1:]]
    fast = parse_maps(json.loads(json.dumps(doc)), from_json=True)
    assert fast.pairs["p3"][0].logical_shape == (shape[0] + 1, *shape[1:])
    assert fast.pairs["p3"][0] != fast.pairs["p0"][0]
    doc["parameters"]["p3"]["target"]["logical_shape"] = [float(shape[0]), *shape[1:]]
    with pytest.raises(InvalidMapError, match="p3"):
        parse_maps(json.loads(json.dumps(doc)), from_json=True)


def test_plans_parsed_once_per_text_keep_each_error_with_its_parameter() -> None:
    doc = _plans()
    name = next(iter(doc["parameters"]))
    plan = doc["parameters"][name]
    doc["parameters"] = {"a": plan, "b": json.loads(json.dumps(plan)), "c": json.loads(json.dumps(plan))}
    fast = parse_plans(json.loads(json.dumps(doc)), from_json=True)
    assert fast == parse_plans(json.loads(json.dumps(doc)))
    assert fast["a"] is fast["b"]
    doc["parameters"]["c"]["segments"][0]["shape"][0] = True
    with pytest.raises(InvalidMapError, match=r"^\$\.parameters\.c\.segments\[0\]\.shape: "):
        parse_plans(json.loads(json.dumps(doc)), from_json=True)


def test_an_element_size_table_of_many_names_is_checked_by_set() -> None:
    """10⁴ parameters: an unknown name in ``element_size`` is named with its nearest parameter
    (the names are data, so the message does not list them all)."""
    doc = _twins(10_000)
    doc["element_size"] = {f"p{i}": 2 for i in range(10_000)}
    doc["element_size"]["p10000x"] = 2
    message = _loader_refuses(parse_maps, doc)
    assert message is not None and '"p10000x"' in message and "did you mean" in message
    assert message.count("p") < 40
    del doc["element_size"]["p10000x"]
    assert parse_maps(doc, from_json=True).element_size == dict.fromkeys((f"p{i}" for i in range(10_000)), 2)
