"""The sweep's summary: medians per call, collio against the better ROMIO, tables, a plot.

A ratio is a collio API's median time over the smaller of the ROMIO APIs' medians for the
same kind, pattern, operation and size, in the same job: below 1, collio is faster.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from ..patterns import human
from .run import Result

__all__ = ["format_tables", "plot", "summarize"]

KINDS = ("call", "batch", "file")


def summarize(results: list[Result]) -> list[dict[str, Any]]:
    """Every result with its median, min, max and mean seconds per call and its ratio."""
    out: list[dict[str, Any]] = []
    for res in results:
        t = res.times
        out.append({
            **dataclasses.asdict(res), "calls": len(t), "median": statistics.median(t),
            "min": min(t), "max": max(t), "mean": statistics.fmean(t), "ratio": None,
        })  # fmt: skip
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in out:
        groups.setdefault(_key(row), []).append(row)
    for rows in groups.values():
        romio = [r["median"] for r in rows if r["family"] == "romio"]
        best = min(romio, default=0.0)
        for r in rows:
            if r["family"] == "collio" and best > 0:
                r["ratio"] = r["median"] / best
    return out


def _key(row: dict[str, Any]) -> tuple[Any, ...]:
    return row["kind"], row["pattern"], row["op"], row["size"]


def ms(seconds: float) -> str:
    """Milliseconds with three significant figures at least (0.0612, 1.81, 312)."""
    v = seconds * 1e3
    return f"{v:.4f}" if v < 0.1 else f"{v:.3f}" if v < 10 else f"{v:.1f}"


def _apis(summary: list[dict[str, Any]], kind: str) -> list[str]:
    return list(dict.fromkeys(r["api"] for r in summary if r["kind"] == kind))


def _table(summary: list[dict[str, Any]], kind: str) -> list[str]:
    """One line per (pattern, operation, size) of ``kind``: each API's median, the ratios."""
    rows = [r for r in summary if r["kind"] == kind]
    if not rows:
        return []
    apis = _apis(summary, kind)
    ours = [a for a in apis if any(r["api"] == a and r["family"] == "collio" for r in rows)]
    sized = kind != "file"
    head = [f"{'pattern':<10}", f"{'op':<5}", f"{'size':>8}"] if sized else [f"{'call':<5}"]
    head += [f"{'calls':>5}", *(f"{a:>12}" for a in apis)]
    head += [f"{a + '/ROMIO':>{max(12, len(a) + 6)}}" for a in ours]
    lines = ["  ".join(head) + (f"  path ({' / '.join(ours)})" if sized else "")]
    groups: dict[tuple[Any, ...], dict[str, dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(_key(r), {})[r["api"]] = r
    for (_, pattern, op, size), by in groups.items():
        cells = [f"{pattern:<10}", f"{op:<5}", f"{_size(size):>8}"] if sized else [f"{op:<5}"]
        cells.append(f"{min(r['calls'] for r in by.values()):>5}")
        cells += [f"{ms(by[a]['median']) if a in by else '-':>12}" for a in apis]
        cells += [f"{_ratio(by.get(a)):>{max(12, len(a) + 6)}}" for a in ours]
        path = " / ".join(by[a]["path"] or "-" if a in by else "-" for a in ours)
        lines.append("  ".join(cells) + (f"  {path}" if sized else ""))
    return lines


def _size(size: int | None) -> str:
    if size is None:
        return "-"
    return human(size).replace(".00", "")


def _ratio(row: dict[str, Any] | None) -> str:
    return "-" if row is None or row["ratio"] is None else f"{row['ratio']:.2f}"


def format_tables(summary: list[dict[str, Any]], nranks: int, batch: int, fsync: bool) -> str:
    """The text summary rank 0 prints: per call, per batch, open/sync/close."""
    sync = "a sync in every call (-e)" if fsync else "no sync per call (-e adds one)"
    out = [
        "",
        f"Time per call, ms: median of the slowest of {nranks} ranks' times; {sync}; "
        "size = bytes per rank per call",
        *_table(summary, "call"),
    ]
    if any(r["kind"] == "batch" for r in summary):
        out += ["", f"Batch: {batch} arrays per rank in one call (collio-many) or {batch} calls "
                "(the others), ms per batch", *_table(summary, "batch")]  # fmt: skip
    if any(r["kind"] == "file" for r in summary):
        out += ["", "open (r+), sync with nothing written, close: ms per call",
                *_table(summary, "file")]  # fmt: skip
    errors = [r for r in summary if r["errors"]]
    verified = sum(r["verified"] for r in summary)
    out += ["", f"verified {verified} calls byte for byte against numpy: "
            + (f"{len(errors)} results WRONG" if errors else "all right")]  # fmt: skip
    out.append("(API/ROMIO: the API's median over the better ROMIO's; path: how collio "
               "moved the first call's bytes)")  # fmt: skip
    return "\n".join(out)


def plot(path: str, summary: list[dict[str, Any]], title: str) -> None:
    """Log-log time per call against size, one line per API, a panel per pattern and op;
    a batch's time per array dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in summary if r["kind"] in ("call", "batch")]
    patterns = list(dict.fromkeys(r["pattern"] for r in rows))
    ops = [op for op in ("write", "read") if any(r["op"] == op for r in rows)]
    fig, axes = plt.subplots(len(patterns), len(ops), figsize=(5.2 * len(ops),
                             3.8 * len(patterns)), squeeze=False, sharex=True)  # fmt: skip
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    apis = list(dict.fromkeys(r["api"] for r in rows))
    for (p, o), ax in zip([(p, o) for p in patterns for o in ops], axes.flat, strict=True):
        for kind, style in (("call", "-o"), ("batch", "--s")):
            for api in _apis(rows, kind):
                color = cycle[apis.index(api) % len(cycle)]
                mine = [r for r in rows if (r["kind"], r["pattern"], r["op"], r["api"])
                        == (kind, p, o, api)]  # fmt: skip
                if not mine:
                    continue
                label = api if kind == "call" else f"{api}, per array of a batch"
                xs = [r["size"] for r in mine]
                ys = [r["median"] * 1e3 / r["count"] for r in mine]
                ax.loglog(xs, ys, style, color=color, label=label, markersize=4)
        ax.set_title(f"{p}, {o}", fontsize=9)
        ax.set_xlabel("bytes per rank per array")
        ax.set_ylabel("ms per call (median)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
