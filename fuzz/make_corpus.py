"""Regenerate the seed corpus: ``python fuzz/make_corpus.py`` (deterministic; overwrites
``fuzz/corpus/<harness>/``).

Seeds: valid maps from the builders and the §4.6 golden layouts (including the 10^9-row,
10^18-element and (10^9, 10^9) cases), refusal cases (facts §6), text-level hostile JSON, plans
files for the valid maps, and for the byte-driven harnesses a few control strings that reach
the policy's split, corruption and hostile modes and the oracle's mutations. Files named
``regression-*`` (inputs that once failed a harness) are kept.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fuzz.seeds import hostile_texts, refusal_docs, valid_docs, valid_plans_docs  # noqa: E402

CORPUS = Path(__file__).resolve().parent / "corpus"

# planner: policy kind (0 balanced, 1 first_holder, 2 lpt, 3 split_balanced, 4 split_balanced_policy
# at the split floor, 5-7 the fuzz policy), budget (0: default),
# split floor (index 1: 0 bytes), endpoints flag, then the policy's mode and its per-request bytes
FUZZ_POLICY = b"\x05\x00\x01\x00"
PLANNER_CONTROLS = {
    "default": b"",
    "first_holder": b"\x01",
    "lpt": b"\x02",
    "split_balanced": b"\x03",
    "split_balanced_small_floor": b"\x04\x00\x01",
    "valid_split": FUZZ_POLICY + b"\x04",
    "valid_split_three_parts": FUZZ_POLICY + b"\x04\x01\x00\x00\x02\x01\x00\x01" * 4,
    "corrupt_split": FUZZ_POLICY + b"\x05\x01\x00\x00\x01\x00",
    "corrupt_overlap": FUZZ_POLICY + b"\x05\x00\x00\x00",
    "generator": FUZZ_POLICY + b"\x08",
    "wrong_length": FUZZ_POLICY + b"\x09\x01",
    "raises": FUZZ_POLICY + b"\x0a\x00",
    "mutates_request": FUZZ_POLICY + b"\x0b",
    "string_answers": FUZZ_POLICY + b"\x0c",
    "dict_answers": FUZZ_POLICY + b"\x0d",
    "bad_answers": FUZZ_POLICY + b"\x06\x03",
    "mixed_answers": FUZZ_POLICY + b"\x0e" + bytes(range(0, 64, 3)),
    "huge_parts": FUZZ_POLICY + b"\x05\x00\x00\x0a\x01",
    "tiny_budget": b"\x00\x05\x03\x00",
    "budget_2p63": b"\x00\x06",
}
# verify: mutation count, then (segment, op, ...) per mutation, then the plan's form
VERIFY_CONTROLS = {
    "unchanged": b"",
    "refined": b"\x01\x00\x00\x00\x01",
    "dropped": b"\x01\x00\x01",
    "duplicated": b"\x01\x00\x02",
    "field_huge": b"\x01\x00\x03\x01\x04\x00",
    "permuted": b"\x01\x00\x05",
    "junk_dict": b"\x00\x02\x00\x00\x00",
    "malformed": b"\x00\x05\x01",
}


def write(harness: str, name: str, data: bytes) -> None:
    folder = CORPUS / harness
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)


def main() -> None:
    for harness in ("maps_loader", "plans_loader", "planner", "verify", "cli"):
        for path in (CORPUS / harness).glob("*"):
            if not path.name.startswith("regression-"):  # inputs that once failed a harness are kept
                path.unlink()
    valid = {k: json.dumps(v).encode() for k, v in valid_docs().items()}
    refusal = {k: json.dumps(v).encode() for k, v in refusal_docs().items()}
    hostile = hostile_texts()
    plans = {k: json.dumps(v).encode() for k, v in valid_plans_docs().items()}
    for name, data in {**valid, **refusal, **hostile}.items():
        write("maps_loader", name, data)
    for name, data in plans.items():
        write("plans_loader", name, data)
    write("plans_loader", "bare_plan", json.dumps(json.loads(plans["identity"])["parameters"]["w"]).encode())
    write("plans_loader", "hostile_nan", plans["identity"].replace(b"[6, 4]", b"[NaN, 4]", 1))
    for name, data in {**valid, **refusal}.items():
        write("planner", name, data)
        write("verify", name, data)
    for ctl_name, ctl in PLANNER_CONTROLS.items():
        for name in ("tp2dp2_to_tp4", "layouts_2to4", "row2_to_col4", "replicated_1e18"):
            write("planner", f"{name}+{ctl_name}", valid[name] + b"\0" + ctl)
    for ctl_name, ctl in VERIFY_CONTROLS.items():
        for name in ("tp2dp2_to_tp4", "layouts_4to2", "f_1e9x1e9_split_2to4", "selector_swapped"):
            write("verify", f"{name}+{ctl_name}", valid[name] + b"\0" + ctl)
    ends = json.dumps({"source": {str(r): r for r in range(4)}, "target": {str(r): r for r in range(4)}}).encode()
    for name in ("tp2dp2_to_tp4", "layouts_2to4", "replicated_1e18", "f_1e9x1e9_split_2to4", "identity"):
        write("cli", f"plan+{name}", b"\x00" + valid[name] + b"\0")
        write("cli", f"plan_stdout_first_holder+{name}", b"\x09" + valid[name] + b"\0")
        write("cli", f"plan_endpoints+{name}", b"\x02" + valid[name] + b"\0" + ends)
        write("cli", f"verify+{name}", b"\x03" + valid[name] + b"\0" + plans[name])
        write("cli", f"verify_json+{name}", b"\x04" + valid[name] + b"\0" + plans[name])
    for name in ("a5_same_shard_addresses", "a9_no_shard_shape", "volume_above_2p62"):
        write("cli", f"plan+{name}", b"\x00" + refusal[name] + b"\0")
        write("cli", f"verify+{name}", b"\x03" + refusal[name] + b"\0" + plans["identity"])
    for name in ("duplicate_key", "deep_nesting", "huge_int_5000_digits", "invalid_utf8", "newline_in_name"):
        write("cli", f"plan+{name}", b"\x00" + hostile[name] + b"\0")
        write("cli", f"verify+{name}", b"\x04" + valid["identity"] + b"\0" + hostile[name])
    write("cli", "plan_bad_element_size", b"\x30" + valid["tp2dp2_to_tp4"] + b"\0")
    write("cli", "plan_negative_split", b"\xc8" + valid["tp2dp2_to_tp4"] + b"\0")
    total = sum(1 for _ in CORPUS.rglob("*") if _.is_file())
    print(f"wrote {total} seeds under {CORPUS}")


if __name__ == "__main__":
    main()
