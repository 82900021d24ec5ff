"""Former home of the batch file formats; they live in ``refplan.formats`` now.

Kept so that ``from refplan.files import parse_maps`` (and every other name below) keeps working.
"""

from __future__ import annotations

from .formats import (
    MAPS_FORMAT,
    PLANS_FORMAT,
    MapsBatch,
    check_keys,
    dump_maps,
    dump_plans,
    load_json,
    loads_json,
    parse_endpoints,
    parse_maps,
    parse_plans,
    read_maps,
)

__all__ = [
    "MAPS_FORMAT",
    "PLANS_FORMAT",
    "MapsBatch",
    "check_keys",
    "dump_maps",
    "dump_plans",
    "load_json",
    "loads_json",
    "parse_endpoints",
    "parse_maps",
    "parse_plans",
    "read_maps",
]
