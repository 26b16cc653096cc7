"""The benchmark's summary: IOR's table plus medians, same-run ratios, peak RSS, JSON, plot."""

from __future__ import annotations

import json
import re
import statistics
from typing import Any

from .run import Row

__all__ = ["summarize", "format_summary", "write_json", "plot"]

MiB = 1 << 20


def summarize(rows: list[Row], apis: list[str]) -> list[dict[str, Any]]:
    """Per (operation, API): max/min/mean/stddev/median of MiB/s and of ops, and the ratio.

    ``ratio`` is this API's median bandwidth over the first API's, for the same
    operation in the same job.
    """
    out: list[dict[str, Any]] = []
    for op in ("write", "read"):
        first: float | None = None
        for api in apis:
            mine = [r for r in rows if r.api == api and r.op == op]
            if not mine:
                continue
            bw = [r.bw for r in mine]
            ops = [r.ops for r in mine]
            med = statistics.median(bw)
            first = med if first is None else first
            errs = [r.errors for r in mine if r.errors >= 0]
            out.append({
                "op": op, "api": api, "iterations": len(mine),
                "max": max(bw), "min": min(bw), "mean": statistics.fmean(bw),
                "stddev": statistics.pstdev(bw), "median": med,
                "max_ops": max(ops), "min_ops": min(ops), "mean_ops": statistics.fmean(ops),
                "median_time": statistics.median(r.total for r in mine),
                "ratio": med / first if first else 0.0,
                "errors": sum(errs) if errs else None, "verified": len(errs),
            })  # fmt: skip
    return out


def format_summary(summary: list[dict[str, Any]], first: str) -> str:
    head = (
        f"{'Operation':<9} {'API':<12} {'Max(MiB)':>9} {'Min(MiB)':>9} {'Mean(MiB)':>9} "
        f"{'StdDev':>8} {'Median':>9} {'Max(OPs)':>9} {'Min(OPs)':>9} {'Mean(OPs)':>9} "
        f"{'ratio':>6} {'#iter':>5} {'errors':>6}"
    )
    lines = ["", "Summary of all tests:", head]
    for s in summary:
        err = "-" if s["errors"] is None else str(s["errors"])
        lines.append(
            f"{s['op']:<9} {s['api']:<12} {s['max']:>9.2f} {s['min']:>9.2f} {s['mean']:>9.2f} "
            f"{s['stddev']:>8.2f} {s['median']:>9.2f} {s['max_ops']:>9.1f} {s['min_ops']:>9.1f} "
            f"{s['mean_ops']:>9.1f} {s['ratio']:>6.2f} {s['iterations']:>5} {err:>6}"
        )
    lines.append(f"(ratio = median MiB/s over {first}'s median, same job, alternating iterations)")
    return "\n".join(lines)


def format_rss(facts: dict[str, Any], aggs: list[int], apis: list[str]) -> str:
    """Peak RSS of each rank per API (MiB), with the growth during the phase, data and role."""
    head = f"{'rank':>4} {'data':>7} {'agg':>4} " + " ".join(f"{a:>17}" for a in apis)
    lines = ["", "Peak RSS per rank, MiB (+ growth during the API's phases):", head]
    rows = zip(facts["peak_rss"], facts["extra_rss"], facts["data_bytes"], strict=True)
    for r, (peak, extra, nbytes) in enumerate(rows):
        cells = " ".join(
            f"{peak.get(a, 0) / MiB:>8.1f} (+{extra.get(a, 0) / MiB:>6.1f})" for a in apis
        )
        lines.append(f"{r:>4} {nbytes / MiB:>7.1f} {'yes' if r in aggs else 'no':>4} {cells}")
    extra = ", and the ceiling's share of the same size" if "ceiling" in apis else ""
    lines.append(
        f"(data: the rank's piece; the benchmark holds it twice, to write and to read{extra})"
    )
    return "\n".join(lines)


def memory_check(
    facts: dict[str, Any], aggs: list[int], cb_buffer_size: int, api: str = "collio"
) -> dict[str, Any]:
    """A collio API's aggregators against the bound: growth <= 2 x cb_buffer_size + 100 MiB.

    The issue's bound is peak <= own data + 2 x cb_buffer_size + 100 MiB; the
    benchmark's own copies of the data are already resident before a phase, so the
    growth during collio's phases is what the bound limits.
    """
    limit = 2 * cb_buffer_size + 100 * MiB
    growth = [int(facts["extra_rss"][r].get(api, 0)) for r in aggs]
    worst = max(growth, default=0)
    return {"limit": limit, "max_growth": worst, "ok": worst <= limit}


#: Hints shown in the text summary (the JSON file has all of them).
_SHOWN = re.compile(
    r"^(cb_\w+|striping_\w+|romio_cb_(read|write)|romio_ds_\w+|direct_\w+"
    r"|early_flush|mapped_reads|reads_mapped|zarr_\w+|h5_\w+|s3_\w+)$"
)


def format_hints(used: dict[str, dict[str, Any]]) -> str:
    """The collective-buffering hints each API used (all of them are in ``--json``)."""
    lines = ["", "Hints used (collective buffering; all in --json):"]
    for api, hints in used.items():
        keep = {k: v for k, v in hints.items() if _SHOWN.match(k)}
        text = " ".join(f"{k}={v}" for k, v in sorted(keep.items())) or "(none)"
        lines.append(f"  {api}: {text}")
    return "\n".join(lines)


def write_json(path: str, doc: dict[str, Any]) -> None:
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1, sort_keys=True, default=str)
        fh.write("\n")


def plot(path: str, summary: list[dict[str, Any]], title: str) -> None:
    """Bars of median MiB/s per API and operation, whiskers from min to max."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = [op for op in ("write", "read") if any(s["op"] == op for s in summary)]
    apis = list(dict.fromkeys(s["api"] for s in summary))
    fig, ax = plt.subplots(figsize=(2.0 + 1.2 * len(apis), 4.2))
    width = 0.8 / max(len(ops), 1)
    for k, op in enumerate(ops):
        rows = {s["api"]: s for s in summary if s["op"] == op}
        xs = [i + k * width for i, a in enumerate(apis) if a in rows]
        med = [rows[a]["median"] for a in apis if a in rows]
        lo = [rows[a]["median"] - rows[a]["min"] for a in apis if a in rows]
        hi = [rows[a]["max"] - rows[a]["median"] for a in apis if a in rows]
        ax.bar(xs, med, width, yerr=[lo, hi], capsize=3, label=op)
        tops = [rows[a]["max"] for a in apis if a in rows]
        for x, m, top in zip(xs, med, tops, strict=True):
            ax.text(x, top, f"{m:.0f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks([i + width * (len(ops) - 1) / 2 for i in range(len(apis))], apis)
    ax.set_ylabel("MiB/s (median; whiskers min-max)")
    ax.set_title(title, fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
