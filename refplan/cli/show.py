"""``refplan show MAPS.json [PLANS.json]``: who sends what, as a table and as a picture.

Prints the per-process load of a plan batch (``analysis.sender_load``: bytes sent per source
process, local copies apart; per source location and in elements when the maps file has no
endpoints or element sizes). Without a plans file the maps are planned first with ``--policy``.

``--svg FILE`` draws, for every parameter, each target shard as a rectangle (axis 0 down, the
remaining axes flattened across) with the region each segment writes filled in the colour of the
source process (or location) that serves it, plus a bar chart of bytes per process. The SVG is
written by hand, no plotting library needed. 1-D shards are drawn to scale: their widths are
proportional to their lengths within a parameter. ``--png FILE`` renders the same picture with
``cairosvg`` or ``matplotlib`` when one is importable (``pip install 'refplan[png]'``); without
one, ``--svg`` is still written and the message says how to get the PNG.

Exit codes: 0 shown; 1 the plans file's plan is invalid (the oracle's verdict is printed and the
picture still drawn, so the gap can be seen); 3 the oracle cannot judge it (unverifiable, as
``refplan verify`` exits; the picture still drawn); 2 bad input (an unreadable or malformed file, naming
the file, the JSON path and the problem in one line; a plan that cannot be drawn: a segment
naming a location the maps lack, a parameter in one file only, which ``refplan verify`` judges
``invalid`` with exit 1; a PNG asked for without a renderer and no SVG to fall back on).
"""

from __future__ import annotations

import argparse
import importlib
import io
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from ..analysis import LoadReport, sender_load
from ..box import box_in_shard, row_major_strides, volume
from ..errors import AffineTransferError, InputFileError, InvalidMapError
from ..formats import (
    STDIN,
    MapsBatch,
    check_keys,
    load_json,
    output_file_name,
    parse_maps,
    parse_plans,
    path_key,
    unwritable,
    write_file,
    write_text_file,
    xml_text,
)
from ..frames import check_sizes
from ..plan import TransferPlan
from ..policies import POLICIES

__all__ = ["add_show_arguments", "load_table", "plan_svg", "run_show_cli"]

PALETTE = (
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948",
    "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac", "#1f77b4", "#8c564b",
)
SHARD_W = 180.0
MAX_RECTS = 20000
MAX_HEIGHT = 16000
"""Pixels of parameters drawn, at most: the rest are counted in one line (the load table lists
every one). A PNG of 600 parameters was 850x144190 pixels, 670 MB and 20 s to render, and 3000
ran for minutes (an outside probe)."""


# ---------------------------------------------------------------------------------------------
# A tiny canvas: primitives that render to SVG text (and, when available, to a PNG).


@dataclass
class _Canvas:
    width: float = 0.0
    height: float = 0.0
    items: list[tuple[Any, ...]] = field(default_factory=list)

    def rect(self, x: float, y: float, w: float, h: float, fill: str, stroke: str = "none", title: str = "") -> None:
        self.items.append(("rect", x, y, w, h, fill, stroke, title))
        self.width = max(self.width, x + w)
        self.height = max(self.height, y + h)

    def text(
        self, x: float, y: float, text: str, size: float = 11.0, anchor: str = "start", bold: bool = False
    ) -> None:
        self.items.append(("text", x, y, text, size, anchor, bold))
        self.width = max(self.width, x + 7.0 * len(text) * size / 11.0 if anchor == "start" else x)
        self.height = max(self.height, y + 4)

    def svg(self) -> str:
        w, h = self.width + 20, self.height + 20
        out = [
            '<?xml version="1.0" encoding="UTF-8"?>',
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{w:.0f}" height="{h:.0f}" '
            f'viewBox="0 0 {w:.0f} {h:.0f}" font-family="sans-serif">',
            f'<rect x="0" y="0" width="{w:.0f}" height="{h:.0f}" fill="#ffffff"/>',
        ]
        for item in self.items:
            if item[0] == "rect":
                _, x, y, rw, rh, fill, stroke, title = item
                attrs = f'x="{x:.2f}" y="{y:.2f}" width="{rw:.2f}" height="{rh:.2f}" fill="{fill}"'
                if stroke != "none":
                    attrs += f' stroke="{stroke}" stroke-width="0.6"'
                if title:
                    out.append(f"<rect {attrs}><title>{escape(xml_text(title))}</title></rect>")
                else:
                    out.append(f"<rect {attrs}/>")
            else:
                _, x, y, text, size, anchor, bold = item
                weight = ' font-weight="bold"' if bold else ""
                out.append(
                    f'<text x="{x:.2f}" y="{y:.2f}" font-size="{size:g}" text-anchor={quoteattr(anchor)}{weight}>'
                    f"{escape(xml_text(text))}</text>"
                )
        out.append("</svg>")
        return "\n".join(out) + "\n"


def png_renderer() -> str | None:
    """The name of an importable PNG renderer (``cairosvg`` or ``matplotlib``), else ``None``."""
    for name in ("cairosvg", "matplotlib"):
        try:
            importlib.import_module(name)
        except Exception:
            continue
        return name
    return None


def _write_png(canvas: _Canvas, path: str, renderer: str) -> None:
    """A PNG at exactly ``path``, written whole or not at all, whatever its name ends with.
    Rendered in memory first: matplotlib given a path appends ``.png`` to a name without an
    extension (so ``--png adir`` wrote ``adir.png`` beside a directory) and picks the format
    from any other (``out.pdf`` wrote a PDF, ``out.xyz`` raised a bare ``ValueError``)."""
    if renderer == "cairosvg":
        cairosvg: Any = importlib.import_module("cairosvg")
        write_file(path, cairosvg.svg2png(bytestring=canvas.svg().encode("utf-8")))
        return
    matplotlib: Any = importlib.import_module("matplotlib")
    matplotlib.use("Agg")
    plt: Any = importlib.import_module("matplotlib.pyplot")
    patches: Any = importlib.import_module("matplotlib.patches")
    w, h = canvas.width + 20, canvas.height + 20
    fig = plt.figure(figsize=(w / 100, h / 100), dpi=100)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, w)
    ax.set_ylim(h, 0)
    ax.axis("off")
    for item in canvas.items:
        if item[0] == "rect":
            _, x, y, rw, rh, fill, stroke, _title = item
            ax.add_patch(patches.Rectangle((x, y), rw, rh, facecolor=fill,
                                           edgecolor=None if stroke == "none" else stroke, linewidth=0.6))
        else:
            _, x, y, text, size, anchor, bold = item
            ha = {"start": "left", "middle": "center", "end": "right"}[anchor]
            # A name is drawn as written, never as math ("$x$"), and a lone surrogate (valid in a
            # JSON name) as its escape: matplotlib raised a bare TypeError on it (an outside probe).
            shown = text.encode("utf-8", "backslashreplace").decode("utf-8")
            ax.text(x, y, shown, fontsize=size * 0.75, ha=ha, va="baseline", weight="bold" if bold else "normal",
                    parse_math=False)
    picture = io.BytesIO()
    try:
        fig.savefig(picture, format="png")
    finally:
        plt.close(fig)
    write_file(path, picture.getvalue())


# ---------------------------------------------------------------------------------------------
# Geometry: which cells of a target shard's 2-d view a segment writes.


def _view(shard: Sequence[int]) -> tuple[int, int]:
    """Rows and columns of a shard's picture: axis 0 down, the other axes flattened across."""
    if len(shard) == 0:
        return 1, 1
    if len(shard) == 1:
        return 1, max(shard[0], 1)
    return max(shard[0], 1), max(volume(shard[1:]), 1)


def _cells(
    offset: int, strides: Sequence[int], shape: Sequence[int], shard: Sequence[int], limit: int = MAX_RECTS
) -> tuple[list[tuple[int, int, int, int]], int]:
    """(row, rows, col, cols) rectangles of the shard view covering what the segment writes, at
    most ``limit`` of them, and how many more it would take at least (drawn as a count, never
    guessed at).

    Exact for a segment that is a box in its shard (one rectangle per column run); a strided
    segment that is not a box is drawn run by run along its last axis, each run clipped to the
    shard's addresses first. Why so strict: a picture that drew a box's span where it has many
    runs showed a never-written half of a shard as written, and one that walked an oversized
    segment row by row before clipping ran out of memory on a plan ``refplan verify`` refuses in
    a fraction of a second.
    """
    rows, cols = _view(shard)
    if len(shard) == 0 or volume(shape) == 0:
        return ([(0, 1, 0, 1)] if volume(shape) else []), 0
    origin = box_in_shard(offset, shape, strides, shard)
    if origin is not None:
        if len(shard) == 1:
            return ([(0, 1, origin[0], shape[0])] if limit > 0 else []), 0 if limit > 0 else 1
        inner_rm = row_major_strides(shard[1:])
        runs = volume(shape[1:-1])
        out = []
        for flat in range(min(runs, limit)):
            idx = []
            for size in reversed(shape[1:-1]):
                flat, i = divmod(flat, size)
                idx.append(i)
            mid = list(reversed(idx))
            coord = [o + i for o, i in zip(origin[1:-1], mid)] + [origin[-1]]
            col = sum(c * s for c, s in zip(coord, inner_rm))
            out.append((origin[0], shape[0], col, shape[-1]))
        return out, runs - len(out)
    # Not a box in the shard (e.g. a physically folded copy that wraps a row): walk address runs.
    out = []
    end = rows * cols
    lead = volume(shape[:-1])
    count_last = shape[-1] if shape else 1
    step = strides[-1] if strides else 1
    for flat in range(lead):
        if len(out) >= limit:
            return out, lead - flat  # at least one rectangle per run not drawn
        rest = flat
        idx = []
        for size in reversed(shape[:-1]):
            rest, i = divmod(rest, size)
            idx.append(i)
        start = offset + sum(i * s for i, s in zip(reversed(idx), strides[:-1]))
        if step != 1:
            for k in range(count_last):
                if len(out) >= limit:
                    return out, (count_last - k) + (lead - flat - 1)
                a = start + k * step
                if 0 <= a < end:
                    out.append((a // cols, 1, a % cols, 1))
            continue
        a, stop = max(start, 0), min(start + count_last, end)  # clipped to the shard first
        while a < stop:
            if len(out) >= limit:
                return out, -(-(stop - a) // cols) + (lead - flat - 1)
            row, col = divmod(a, cols)
            take = min(stop - a, cols - col)
            out.append((row, 1, col, take))
            a += take
    return out, 0


# ---------------------------------------------------------------------------------------------
# The picture and the table.


def _source_key(seg_source: int, batch: MapsBatch) -> int:
    if batch.endpoints is not None:
        return batch.endpoints.source.get(seg_source, seg_source)
    return seg_source


def _senders(batch: MapsBatch) -> list[int]:
    if batch.endpoints is not None:
        return sorted(set(batch.endpoints.source.values()))
    return sorted({loc for _t, s in batch.pairs.values() for loc in s.shard_shapes})


def _load(batch: MapsBatch, plans: Mapping[str, TransferPlan]) -> LoadReport:
    return sender_load(plans, endpoints=batch.endpoints, element_size=batch.element_size, senders=_senders(batch))


def load_table(batch: MapsBatch, plans: Mapping[str, TransferPlan]) -> str:
    """The per-process (or per-location) load table ``refplan show`` prints."""
    report = _load(batch, plans)
    who = "process" if report.by_process else "location"
    unit = "bytes" if batch.element_size is not None else "elements"
    keys = sorted(set(report.sent) | set(report.local))
    total = report.total_sent
    lines = [f"{'source ' + who:>16}  {'sent ' + unit:>16}  {'local ' + unit:>16}  {'share':>7}"]
    for k in keys:
        sent = report.sent.get(k, 0)
        share = f"{100.0 * sent / total:.1f}%" if total else "-"
        lines.append(f"{k:>16}  {sent:>16}  {report.local.get(k, 0):>16}  {share:>7}")
    lines.append(
        f"total sent {total} {unit}; busiest sender / even share = {report.imbalance():.2f}"
        + ("" if report.by_process else " (no endpoints: per source location)")
    )
    return "\n".join(lines)


def plan_svg(batch: MapsBatch, plans: Mapping[str, TransferPlan], title: str = "refplan plan") -> str:
    """The SVG picture of a plan batch (see the module docstring)."""
    return _draw(batch, plans, title).svg()


def _draw(batch: MapsBatch, plans: Mapping[str, TransferPlan], title: str) -> _Canvas:
    canvas = _Canvas()
    by_process = batch.endpoints is not None
    noun = "process" if by_process else "source location"
    used = {_source_key(s.source_rank, batch) for p in plans.values() for s in p.segments}
    keys = sorted(set(_senders(batch)) | used)
    colour = {k: PALETTE[i % len(PALETTE)] for i, k in enumerate(keys)}
    y = 20.0
    canvas.text(10, y, title, size=14, bold=True)
    y += 22
    x = 10.0
    for k in keys:
        canvas.rect(x, y - 10, 12, 12, colour[k], "#333333", f"{noun} {k}")
        label = f"{noun} {k}"
        canvas.text(x + 16, y, label)
        x += 30 + 7 * len(label)
        if x > 900:
            x = 10.0
            y += 18
    y += 24
    drawn = 0
    skipped = 0
    shown = [name for name in sorted(plans) if name in batch.pairs]
    left_out = 0
    for index, name in enumerate(shown):
        if y > MAX_HEIGHT:
            left_out = len(shown) - index
            break
        plan = plans[name]
        target, _source = batch.pairs[name]
        canvas.text(10, y, f"{name}  F{tuple(plan.logical_shape)}  {len(plan.segments)} segments", size=12, bold=True)
        y += 10
        shards = sorted(target.shard_shapes.items())
        by_target: dict[int, list[Any]] = {}
        for seg in plan.segments:
            by_target.setdefault(seg.target_rank, []).append(seg)
        x = 10.0
        row_h = 0.0
        longest = max((s[0] for _loc, s in shards if len(s) == 1), default=0)
        for loc, shard in shards:
            rows, cols = _view(shard)
            h = SHARD_W * min(max(rows / cols, 0.15), 1.0)
            # A 1-D shard's only dimension is its length: drawn to scale against the longest one,
            # so uneven shards look uneven (never thinner than a visible sliver).
            width = max(SHARD_W * shard[0] / longest, 2.0) if len(shard) == 1 and longest > 0 else SHARD_W
            if x + SHARD_W > 10 + 5 * (SHARD_W + 30):
                x = 10.0
                y += row_h + 40
                row_h = 0.0
            proc = batch.endpoints.target.get(loc) if batch.endpoints is not None else None
            label = f"target {loc}" + (f" -> process {proc}" if proc is not None else "") + f" {tuple(shard)}"
            canvas.text(x, y + 14, label, size=10)
            top = y + 20
            canvas.rect(x, top, width, h, "#eeeeee", "#555555", f"target location {loc}, shard {tuple(shard)}")
            for seg in by_target.get(loc, []):
                key = _source_key(seg.source_rank, batch)
                cells, omitted = _cells(seg.target_offset, seg.target_strides, seg.shape, shard, MAX_RECTS - drawn)
                skipped += omitted
                for r0, nr, c0, nc in cells:
                    drawn += 1
                    canvas.rect(
                        x + width * c0 / cols, top + h * r0 / rows,
                        max(width * nc / cols, 0.75), max(h * nr / rows, 0.75), colour[key], "#ffffff",
                        f"{noun} {key} (source location {seg.source_rank}) -> target location {loc}: "
                        f"shape {seg.shape}",
                    )
            row_h = max(row_h, h)
            x += SHARD_W + 30
        y += row_h + 50
    if left_out:
        canvas.text(10, y, f"({left_out} more parameters not drawn; the load table counts them all)", size=10)
        y += 20
    if skipped:
        canvas.text(10, y, f"(at least {skipped} more rectangles not drawn)", size=10)
        y += 20
    report = _load(batch, plans)
    unit = "bytes" if batch.element_size is not None else "elements"
    canvas.text(10, y, f"{unit} sent per {noun} (local copies lighter)", size=12, bold=True)
    y += 12
    totals = {k: report.sent.get(k, 0) + report.local.get(k, 0) for k in keys}
    peak = max(totals.values(), default=0) or 1
    for k in keys:
        sent, local = report.sent.get(k, 0), report.local.get(k, 0)
        canvas.text(10, y + 12, f"{noun} {k}", size=10)
        bar_x = 130.0
        w_sent = 400.0 * sent / peak
        w_local = 400.0 * local / peak
        canvas.rect(bar_x, y + 2, max(w_sent, 0.0), 12, colour[k], "none", f"{noun} {k}: {sent} {unit} sent")
        if local:
            canvas.rect(bar_x + w_sent, y + 2, w_local, 12, "#cccccc", colour[k], f"{noun} {k}: {local} {unit} local")
        canvas.text(bar_x + w_sent + w_local + 6, y + 12, f"{sent}" + (f" + {local} local" if local else ""), size=10)
        y += 18
    if by_process and batch.endpoints is not None:
        receivers = sorted(set(batch.endpoints.target.values()) - set(keys))
        if receivers:
            y += 6
            canvas.text(10, y + 10, "receiving only: " + ", ".join(f"process {p}" for p in receivers), size=10)
    return canvas


# ---------------------------------------------------------------------------------------------
# CLI


def add_show_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``refplan show``."""
    parser.add_argument("maps", help="maps batch file (refplan.maps/1; '-' reads standard input)")
    parser.add_argument("plans", nargs="?", help="plans file (refplan.plans/1, or a bare plan for one parameter); "
                        "default: plan the maps with --policy")
    parser.add_argument("--policy", choices=sorted(POLICIES), default="balanced",
                        help="replica policy when planning here (default: balanced)")
    parser.add_argument("--svg", metavar="FILE", type=output_file_name, help="write an SVG picture of the plan")
    parser.add_argument("--png", metavar="FILE", type=output_file_name,
                        help="write a PNG (needs cairosvg or matplotlib)")


class _BadInput(Exception):
    pass


def _prefixed(path: str, exc: Exception) -> str:
    """``<class>: <path>: <message>``: the line ``refplan plan`` and ``refplan verify`` print for
    the same file (the class first, then the file, then the JSON path and the problem)."""
    text = str(exc)
    return f"{type(exc).__name__}: " + (text if text.startswith(path) else f"{path}: {text}")


def _load_plans(path: str, batch: MapsBatch, batch_path: str) -> dict[str, TransferPlan]:
    try:
        doc = load_json(path)
        if isinstance(doc, Mapping) and "format" not in doc and "segments" in doc:
            if len(batch.pairs) != 1:
                raise InvalidMapError(f"$: a bare plan needs a maps file with one parameter, this one has "
                                      f"{len(batch.pairs)}")
            (name,) = batch.pairs
            check_keys(doc, "plan")
            plans = {name: TransferPlan.from_dict(doc, "$")}
        else:
            plans = parse_plans(doc, from_json=True)
    except (AffineTransferError, InputFileError) as exc:
        raise _BadInput(_prefixed(path, exc)) from None
    for name in sorted(plans):
        where = path_key("$.parameters", name)
        if name not in batch.pairs:
            raise _BadInput(f"InvalidMapError: {path}: {where}: no such parameter in the maps file")
        target, source = batch.pairs[name]
        ends = batch.endpoints
        for i, seg in enumerate(plans[name].segments):
            for side, loc, known in (("source", seg.source_rank, source), ("target", seg.target_rank, target)):
                if loc not in known.shard_shapes:
                    raise _BadInput(f"InvalidMapError: {path}: {where}.segments[{i}].{side}[0]: location {loc} "
                                    f"is not in the {side} map")
                # The load table counts per process: a location the maps file's endpoints leave
                # unbound would end the table in a bare KeyError (as `refplan plan` refuses such
                # endpoints, a plans file met with them is refused here, naming the place).
                if ends is not None and loc not in (ends.source if side == "source" else ends.target):
                    raise _BadInput(f"InvalidMapError: {path}: {where}.segments[{i}].{side}[0]: location {loc} "
                                    f"has no process in the endpoints of {batch_path}")
    for name in sorted(batch.pairs):
        if name not in plans:
            raise _BadInput(f"InvalidMapError: {path}: $.parameters: no plan for parameter {name!r} of the maps file")
    return plans


def run_show_cli(args: argparse.Namespace) -> int:
    """Print the load table; write the SVG / PNG. 0 ok, 2 bad input (one line on stderr)."""
    from ..planner import plan_transfers
    from ..verify import verify_plans

    prog = "refplan show"
    quiet = bool(getattr(args, "quiet", False))
    renderer = None
    if args.png:
        renderer = png_renderer()
        if renderer is None and not args.svg:
            print(f"{prog}: --png needs cairosvg or matplotlib and neither is importable "
                  "(pip install 'refplan[png]'), or use --svg", file=sys.stderr)
            return 2
    if args.maps == STDIN and args.plans == STDIN:
        print(f"{prog}: standard input (-) is named for both the maps and the plans; it can be read once",
              file=sys.stderr)
        return 2
    if args.svg == STDIN and args.png == STDIN:
        print(f"{prog}: --svg - and --png - both write to standard output; write one to a file", file=sys.stderr)
        return 2
    for picture in (args.svg, args.png):
        problem = None if picture is None else unwritable(picture)
        if problem is not None:
            print(f"{prog}: {problem}", file=sys.stderr)
            return 2
    # A picture on standard output gets it alone: the table and the oracle's line went there too,
    # before it, and the file was no SVG or PNG any reader could open (an outside probe).
    text_out = sys.stderr if STDIN in (args.svg, args.png) else sys.stdout
    try:
        try:
            batch = parse_maps(load_json(args.maps))
        except (AffineTransferError, InputFileError) as exc:
            raise _BadInput(_prefixed(args.maps, exc)) from None
        try:
            check_sizes(batch.pairs)  # as `refplan plan` refuses them, also when a plans file is shown
        except AffineTransferError as exc:
            raise _BadInput(f"{type(exc).__name__}: {exc}") from None
        if args.plans:
            plans = _load_plans(args.plans, batch, args.maps)
            origin = f"plans from {args.plans}"
        else:
            try:
                plans = plan_transfers(
                    batch.pairs,
                    endpoints=batch.endpoints,
                    element_size=batch.element_size,
                    replica_policy=POLICIES[args.policy],
                    process_node=batch.process_node,  # without endpoints, refused as plan_transfers refuses it
                )
            except AffineTransferError as exc:
                raise _BadInput(f"{type(exc).__name__}: {exc}") from None
            origin = f"policy {args.policy}"
    except _BadInput as exc:
        print("\\n".join(f"{prog}: {exc}".splitlines()), file=sys.stderr)
        return 2
    segments = sum(len(p.segments) for p in plans.values())
    if not quiet:
        print(f"{prog}: {len(plans)} parameter(s), {segments} segments, {origin}", file=text_out)
        print(load_table(batch, plans), file=text_out)
    if getattr(args, "verbose", False):  # -v: every parameter (before, -v was accepted and did nothing)
        for name in sorted(plans):
            plan = plans[name]
            print(f"  {name}: {len(plan.segments)} segments, {plan.moved_elements} elements", file=text_out)
    code = 0
    if args.plans:
        verdict = verify_plans(batch.pairs, plans)
        bad = [str(v) for v in verdict.verdicts.values() if not v.ok]
        print(f"oracle: {verdict.status}" + (f" ({bad[0]})" if bad else ""), file=text_out)
        code = 0 if verdict.ok else verdict.exit_code  # the picture is still drawn: it shows the gap
    title = f"{Path(args.maps).name}: {origin}"
    writing: str | None = None
    try:
        if args.svg:
            writing = args.svg
            write_text_file(args.svg, plan_svg(batch, plans, title))
        if args.png and renderer is not None:
            writing = args.png
            _write_png(_draw(batch, plans, title), args.png, renderer)
        elif args.png:
            print(f"{prog}: no PNG written: it needs cairosvg or matplotlib (pip install 'refplan[png]'); "
                  f"the SVG is in {args.svg}", file=sys.stderr)
    except OSError as exc:  # the path being written (a write's own error carries no file name)
        print(f"{prog}: cannot write {writing if writing is not None else exc.filename}: {exc.strerror or exc}",
              file=sys.stderr)
        return 2
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="refplan show", description=__doc__.split("\n")[0])
    add_show_arguments(parser)
    return run_show_cli(parser.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
