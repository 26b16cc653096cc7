"""Write docs/benchmarks.md, and the README's short table, from docs/results/*.json.

    python docs/make_benchmarks.py            rewrite both from the JSON results
    python docs/make_benchmarks.py --check    exit 1 if either differs from what it would write

Every figure comes from a file that ``collio-bench --json`` wrote (docs/run_benchmarks.sh
runs the jobs and then this script), so rerunning the jobs rewrites the tables and no
figure is copied by hand.  A script here rather than a ``collio-bench`` mode: the tables
are this repository's documentation (which jobs, in which order, under which heading),
not something a user of the benchmark needs.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shlex
import statistics
import sys
import textwrap
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent
RESULTS, OUT, README = DOCS / "results", DOCS / "benchmarks.md", DOCS.parent / "README.md"
BEGIN, END = "<!-- benchmarks:begin -->", "<!-- benchmarks:end -->"
MiB = 1 << 20

#: The posix-backend jobs: one 4-rank job per workload, six APIs alternating.
ARRAYS = {"colblock": "column blocks", "cyclic": "block-cyclic 64 x 64, 2 x 2 grid",
          "ior": "IOR `-s 4096 -b 8k -t 8k`", "rowblock": "row blocks"}  # fmt: skip
SIX = ("collio", "collio-shuffle", "mpiio", "mpiio-tuned", "posix", "ceiling")
OTHERS = {"zarr-aligned": "zarr, chunks 512 (aligned with the blocks)",
          "zarr-misaligned": "zarr, chunks 768 (misaligned)", "hdf5": "HDF5, contiguous",
          "hdf5-gzip": "HDF5, gzip, chunks 512", "mpiio": "mpiio backend against posix",
          "mpi-file": "collio.mpi.File, ROMIO's calls on collio",
          "s3": "S3, moto server on 127.0.0.1"}  # fmt: skip
SINGLE_COPY = {"colblock": "single-copy-off-colblock", "cyclic": "single-copy-off-cyclic"}
#: The job of ``collio-bench --sweep``: time per call at each size.
SWEEP = "sweep"
#: Two-level aggregation: 8-rank jobs with consecutive groups of 4 ranks as nodes.
TWO_LEVEL = {"two-level-colblock": "column blocks", "two-level-cyclic": "block-cyclic 64 x 64"}
LEVELS = ("collio", "collio-two-level", "collio-one-level", "mpiio")
#: ``collio-bench --calibrate``: the cost model's terms measured here, checked on real calls.
CALIBRATE = ("calibrate-4", "calibrate-8")
TINY_ARRAY = "64 x 64 float64"


def load() -> dict[str, dict[str, Any]]:
    """Every result by job name: NAME.json, or NAME.json.gz for the simulator's large ones."""
    docs = {p.stem: json.loads(p.read_text()) for p in RESULTS.glob("*.json")}
    for p in RESULTS.glob("*.json.gz"):
        docs[p.name.removesuffix(".json.gz")] = json.loads(gzip.decompress(p.read_bytes()))
    return dict(sorted(docs.items()))


def command(doc: dict[str, Any]) -> str:
    """The command that made ``doc``, as typed (without ``--json FILE`` or ``--plot FILE``)."""
    args, words = list(doc["command"]), []
    while args:
        word = args.pop(0)
        if word in ("--json", "--plot"):  # where this run saved its figures
            args.pop(0)
        elif not word.startswith(("--json=", "--plot=")):
            words.append(word)
    text = " ".join(shlex.quote(w) for w in words)
    if "--simulate" in words:
        return text
    env = "MPIR_CVAR_CH4_CMA_ENABLE=0 " if doc["machine"].get("single_copy") is False else ""
    if doc["machine"].get("ranks_per_node_env"):
        env += f"COLLIO_RANKS_PER_NODE={doc['machine']['ranks_per_node_env']} "
    return f"{env}mpiexec -n {doc['nranks']} {text}"


def machine(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    disk = m.get("storage", {})
    where = f"{disk.get('fs', '?')} on {disk.get('device', '?')}"
    if disk.get("driver"):
        where += f" ({disk['driver']}{', mounted with discard' if disk.get('discard') else ''})"
    text = f"{m['cpus']} CPUs ({m['cpu_model']}), {m['memory_gib']} GiB, {where}"
    if "mpi_library" in m:
        nodes = m.get("nodes", 1)
        text += (
            f", {m['mpi_library'].replace('Version: ', '')}, mpi4py {m['mpi4py']}, "
            f"{doc['nranks']} ranks on {nodes} node{'s' if nodes > 1 else ''}"
        )
    return text + f", Python {m['python']}, numpy {m['numpy']}"


def median(doc: dict[str, Any], api: str, op: str) -> float | None:
    for s in doc["summary"]:
        if s["api"] == api and s["op"] == op:
            return float(s["median"])
    return None


def _n(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def _r(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}"


def provenance(docs: dict[str, dict[str, Any]], names: list[str]) -> list[str]:
    """Which machine and which commands made the jobs ``names``."""
    found = [n for n in names if n in docs]
    if not found:
        return []
    one = len({machine(docs[n]) for n in found}) == 1
    lines = ["", f"Machine: {machine(docs[found[0]])}.", ""] if one else [""]
    copies = {str(docs[n]["machine"].get("single_copy")) for n in found}
    if "--simulate" not in docs[found[0]]["command"] and len(copies) == 1:
        state = {"True": "on", "False": "off"}.get(copies.pop(), "unknown")
        lines += [f"MPICH's single-copy messages: {state} (as MPI reported it).", ""]
    lines += ["Made by:", ""]
    for n in found:
        where = "" if one else f" on {machine(docs[n])}"
        lines.append(f"- `{command(docs[n])}`{where}")
    return lines


def iterations(doc: dict[str, Any]) -> str:
    return f"{doc['iterations']} iterations"


def median_table(
    docs: dict[str, dict[str, Any]],
    jobs: dict[str, str],
    apis: tuple[str, ...],
    ratios: dict[str, tuple[str, str]],
) -> list[str]:
    """One row per job and op: each API's median, then each ratio ``name: (a, b)``."""
    head = ["workload", "op", *apis, *ratios]
    out = ["| " + " | ".join(head) + " |", "|" + " --- |" * 2 + " ---: |" * (len(head) - 2)]
    for name, what in jobs.items():
        doc = docs.get(name)
        if doc is None:
            continue
        for op in ("write", "read"):
            m = {a: median(doc, a, op) for a in apis}
            label = f"{what}, {iterations(doc)}" if op == "write" else ""
            cells = [label, op, *(_n(m[a]) for a in apis)]
            cells += [_r(m[a], m[b]) for a, b in ratios.values()]
            out.append("| " + " | ".join(cells) + " |")
    return out


def arrays_table(docs: dict[str, dict[str, Any]]) -> list[str]:
    ratios = {"collio / ceiling": ("collio", "ceiling"),
              "collio / ROMIO tuned": ("collio", "mpiio-tuned"),
              "collio / ROMIO default": ("collio", "mpiio")}  # fmt: skip
    return median_table(docs, ARRAYS, SIX, ratios)


def readme_table(docs: dict[str, dict[str, Any]]) -> list[str]:
    doc = docs.get("colblock")
    if doc is None:
        return ["(no result yet: run docs/run_benchmarks.sh)"]
    apis = {"collio": "collio", "mpiio": "ROMIO default", "mpiio-tuned": "ROMIO tuned",
            "posix": "pwrite/pread per piece", "ceiling": "ceiling"}  # fmt: skip
    out = ["| MiB/s | " + " | ".join(apis.values()) + " | collio / ROMIO tuned |"]
    out.append("| --- |" + " ---: |" * (len(apis) + 1))
    for op in ("write", "read"):
        m = {a: median(doc, a, op) for a in apis}
        row = [op, *(_n(m[a]) for a in apis), _r(m["collio"], m["mpiio-tuned"])]
        out.append("| " + " | ".join(row) + " |")
    out += ["", f"Made by `{command(doc)}` ({iterations(doc)}) on {machine(doc)}."]
    return out


def single_copy_table(docs: dict[str, dict[str, Any]]) -> list[str]:
    head = "| workload | single-copy | collio write | ceiling write | collio / ceiling |"
    head += " collio-shuffle read | ROMIO tuned read | collio-shuffle / tuned |"
    out = [head, "| --- | --- |" + " ---: |" * 6]
    for name, off in SINGLE_COPY.items():
        for job in (name, off):
            doc = docs.get(job)
            if doc is None:
                continue
            state = {True: "on", False: "off"}.get(doc["machine"].get("single_copy"), "?")
            w, cw = median(doc, "collio", "write"), median(doc, "ceiling", "write")
            r, tr = median(doc, "collio-shuffle", "read"), median(doc, "mpiio-tuned", "read")
            cells = [ARRAYS[name], state, _n(w), _n(cw), _r(w, cw), _n(r), _n(tr), _r(r, tr)]
            out.append("| " + " | ".join(cells) + " |")
    return out


def two_level_table(docs: dict[str, dict[str, Any]]) -> list[str]:
    ratio = {"two-level / one-level": ("collio-two-level", "collio-one-level")}
    return median_table(docs, TWO_LEVEL, LEVELS, ratio)


def prediction_table(docs: dict[str, dict[str, Any]]) -> list[str]:
    out = [
        "| command | strategy | aggregators | local aggregators | rounds | messages per "
        "aggregator and round | smallest mean message | plan | predicted |",
        "| --- | --- |" + " ---: |" * 7,
    ]
    for name, doc in docs.items():
        pred = doc.get("prediction") if name.startswith("sim-") else None
        if pred is None:
            continue
        args = " ".join(command(doc).split()[1:]).replace("--simulate ", "")
        for i, s in enumerate(pred["strategies"]):
            local = s["local_per_node"] * s["nodes"] if s["two_level"] else 0
            cells = [f"`{args}`" if i == 0 else "", s["strategy"], str(s["aggregators"]),
                     str(local), str(s["rounds"]), str(s["max_sources"]),
                     f"{s['min_message'] / 1024:.1f} KiB", f"{s['plan_seconds']:.1f} s",
                     f"{s['predicted_seconds']:.2f} s"]  # fmt: skip
            out.append("| " + " | ".join(cells) + " |")
    return out


def calibration_table(docs: dict[str, dict[str, Any]]) -> list[str]:
    out = [
        "| ranks | nodes | workload | API | op | measured | fixed cost | a round's own "
        "| predicted | predicted / measured | within +-30% |",
        "| ---: | ---: | --- | --- | --- |" + " ---: |" * 5 + " --- |",
    ]
    for name in CALIBRATE:
        doc = docs.get(name)
        if doc is None:
            continue
        first = True
        for c in doc["cases"]:
            what = {"colblock": "column blocks", "cyclic": "block-cyclic 64 x 64"}[c["pattern"]]
            cells = [str(doc["nranks"]) if first else "", str(doc["nodes"]) if first else "",
                     what, c["api"], c["op"], f"{c['measured_seconds']:.3f} s",
                     f"{c['terms']['call']:.3f} s",
                     _ms(c["cluster"].get("step_seconds")),
                     f"{c['predicted_seconds']:.3f} s",
                     f"{c['ratio']:.2f}",
                     "yes" if c["within"] else "**no**"]  # fmt: skip
            out.append("| " + " | ".join(cells) + " |")
            first = False
    return out


def _ms(seconds: float | None) -> str:
    """Milliseconds, or a dash for a figure the run did not measure."""
    return "-" if seconds is None else f"{seconds * 1e3:.2f} ms"


def calibration_count(docs: dict[str, dict[str, Any]]) -> str:
    parts = []
    for name in CALIBRATE:
        if name in docs:
            cases = docs[name]["cases"]
            ok = sum(1 for c in cases if c["within"])
            parts.append(f"{docs[name]['nranks']} ranks: {ok} of {len(cases)}")
    return "Within +-30% of the measured time: " + "; ".join(parts) + "."


def calibration_terms(docs: dict[str, dict[str, Any]]) -> list[str]:
    out = []
    for name in CALIBRATE:
        doc = docs.get(name)
        if doc is None:
            continue
        t = doc["terms"]
        cl = {c["op"]: c["cluster"] for c in doc["cases"]}
        fixed = ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in doc["fixed_seconds"].items())
        per_run = {f"{c['api']} {c['op']}": c["cluster"].get("plan_run_seconds")
                   for c in doc["cases"]}  # fmt: skip
        planning = ", ".join(f"{k} {(v or 0) * 1e9:.0f} ns" for k, v in per_run.items())
        planning = f"; planning per run: {planning}" if None not in per_run.values() else ""
        out.append(
            f"- {doc['nranks']} ranks: a core copies at {t['copy_bandwidth'] / 1e9:.2f} GB/s "
            "with every rank copying, "
            f"MPI moves {t.get('message_bandwidth', 0) / 1e9:.2f} GB/s between two, "
            f"a message costs {t['message_seconds'] * 1e6:.2f} us, "
            + (
                f"a rendezvous waits {t['handshake_seconds'] * 1e6:.0f} us, "
                if "handshake_seconds" in t
                else ""
            )
            + "the ranks meet in "
            f"{t.get('round_seconds', 0) * 1e3:.2f} ms, {int(t['cores_per_node'])} "
            f"core(s) per node for {doc['ppn']} ranks; the ceiling writes at "
            f"{cl['write']['target_bandwidth'] / 1e6:.0f} MB/s and reads at "
            f"{cl['read']['target_bandwidth'] / 1e6:.0f} MB/s beyond its fixed cost; fixed "
            f"costs (`{TINY_ARRAY}`): {fixed}{planning}"
        )
    return out


def cluster_line(docs: dict[str, dict[str, Any]]) -> str:
    cl = next((d["prediction"]["cluster"] for d in docs.values() if "prediction" in d), None)
    if cl is None:
        return ""
    return (
        f"Cluster: {cl['ppn']} ranks per node, {cl['node_bandwidth'] / 1e9:g} GB/s and "
        f"{cl['message_seconds'] * 1e6:g} us per inter-node message per node, "
        f"{cl['targets']} storage targets of {cl['target_bandwidth'] / 1e9:g} GB/s, "
        f"{cl['aggregator_bandwidth'] / 1e9:g} GB/s per aggregator; on a node "
        f"{cl['intra_message_seconds'] * 1e6:g} us per message and "
        f"{cl['intra_bandwidth'] / 1e9:g} GB/s per process (`collio.sim.Cluster`)."
    )


def others_table(docs: dict[str, dict[str, Any]]) -> list[str]:
    out = ["| target | op | API | median MiB/s | min - max | this / the first |"]
    out.append("| --- | --- | --- |" + " ---: |" * 3)
    for name, what in OTHERS.items():
        doc = docs.get(name)
        if doc is None:
            continue
        first = True
        for s in doc["summary"]:
            label = f"{what}, {iterations(doc)}" if first else ""
            first = False
            cells = [label, s["op"], s["api"], _n(s["median"]), f"{s['min']:.0f} - {s['max']:.0f}"]
            out.append("| " + " | ".join([*cells, f"{s['ratio']:.2f}"]) + " |")
        for api, why in doc.get("unavailable", {}).items():
            out.append(f"| | | {api} | not run: {why.split(';')[0]} | | |")
    return out


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    v = seconds * 1e3
    return f"{v:.3g}" if v < 1000 else f"{v:.0f}"


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or n % 1024:
            return f"{n} {unit}"
        n //= 1024
    return f"{n} TiB"


def sweep_table(doc: dict[str, Any], kind: str) -> list[str]:
    """One row per pattern, operation and size of ``kind``: each API's median, collio's
    ratio to the better ROMIO, and how collio moved the bytes."""
    rows = [r for r in doc["results"] if r["kind"] == kind]
    apis = list(dict.fromkeys(r["api"] for r in rows))
    ours = [a for a in apis if any(r["api"] == a and r["family"] == "collio" for r in rows)]
    sized = kind != "file"
    head = ["pattern", "op", "size per rank"] if sized else ["call"]
    head += ["calls", *apis, *(f"{a} / better ROMIO" for a in ours)]
    head += [f"path ({' / '.join(ours)})"] if sized else []
    align = " --- |" * (3 if sized else 1) + " ---: |" * (1 + len(apis) + len(ours))
    out = ["| " + " | ".join(head) + " |", "|" + align + (" --- |" if sized else "")]
    groups: dict[tuple[Any, ...], dict[str, dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["pattern"], r["op"], r["size"]), {})[r["api"]] = r
    for (pattern, op, size), by in groups.items():
        cells = [pattern, op, _bytes(size)] if sized else [op]
        cells.append(str(min(r["calls"] for r in by.values())))
        cells += [_ms(by[a]["median"]) if a in by else "-" for a in apis]
        cells += [_r(by[a]["ratio"], 1.0) if a in by and by[a]["ratio"] else "-" for a in ours]
        if sized:
            cells.append(" / ".join(by[a]["path"] or "-" if a in by else "-" for a in ours))
        out.append("| " + " | ".join(cells) + " |")
    return out


def _wrap(text: str) -> list[str]:
    """``text`` as lines of the page's width, never breaking inside a name like `mpiio-tuned`."""
    return textwrap.wrap(text, 88, break_on_hyphens=False, break_long_words=False)


def _throttled(doc: dict[str, Any]) -> list[str]:
    """Writes without a sync per call run at the page cache's speed until the kernel
    throttles dirty pages: the sizes whose calls, over every API, spread more than
    :data:`THROTTLED` times between their tenth and ninetieth percentiles, and their
    spread, which says so."""
    if doc["fsync"]:
        return []
    spread = []
    for size in sorted(doc["sizes"]):
        times = [t for r in doc["results"] if r["kind"] == "call" and r["op"] == "write"
                 and r["size"] == size for t in r["times"]]  # fmt: skip
        # (the tenth and ninetieth percentiles, not the extremes: one stray slow call
        # is no throttle; a throttle slows the calls from some call on)
        if len(times) >= 10 and _pct(times, 90) > THROTTLED * _pct(times, 10):
            lo, hi = _ms(min(times)), _ms(max(times))
            spread.append(f"{_bytes(size)} per rank, from {lo} to {hi} ms")
    if not spread:
        return []
    text = (
        "Writes with no sync per call run at the page cache's speed until the kernel "
        "throttles the dirty pages, and which API's calls met the throttle first decides "
        f"their medians more than how they write: every API's calls took, at "
        f"{'; '.join(spread)} (`times` in the JSON). Large writes are compared in the tables "
        "above (`collio-bench --compare`, a sync in every iteration)."
    )
    return ["", *_wrap(text)]


#: A size's write calls (over every API) whose ninetieth percentile took this many times
#: their tenth met the kernel's throttle of dirty pages.
THROTTLED = 5


def _pct(values: list[float], q: int) -> float:
    return float(statistics.quantiles(values, n=100, method="inclusive")[q - 1])


def sweep_section(docs: dict[str, dict[str, Any]]) -> list[str]:
    doc = docs.get(SWEEP)
    if doc is None:
        return ["(no result yet: run docs/run_benchmarks.sh sweep)"]
    sync = "with a sync in every call" if doc["fsync"] else "no sync per call"
    about = (
        f"Milliseconds per call: the median of the slowest of {doc['nranks']} ranks' times, "
        f"{sync}. Each API keeps its own file open and each call writes a new step after the "
        "last (as a time series does; no call rewrites bytes), the APIs alternating call by "
        "call; reads read the steps back in order. `contiguous`: one run per rank; "
        f"`strided`: {doc['runs']} runs per rank, interleaved across ranks (fewer when the "
        "size holds fewer float64). `mpiio` is ROMIO with its defaults, `mpiio-tuned` with "
        "`cb_nodes` = ranks and `cb_config_list` = `*:*`; a ratio below 1 is collio ahead. "
        "`ceiling`: each rank's bytes in one `pwritev` (`preadv`) to a range of its own, then "
        "one allreduce of whether every rank's request succeeded: the least a call costs "
        "that agrees its outcome on every rank after its I/O, as collio's calls do (ROMIO's "
        "calls whose pieces do not interleave gather every rank's offsets before their "
        "I/O, write independently and agree nothing after it, so they can end below it). "
        "Every API's first call per size is checked byte for byte against numpy. The path "
        "is the first call's; from the third call of a size on, collio's direct and mapped "
        "calls do their I/O before their one agreement (`last_call['guessed']`), and its "
        "two-phase writes go from their head straight to their kept round and one "
        "completion (the kept lane's step, docs/design.md)."
    )
    out = [*_wrap(about), "", *sweep_table(doc, "call"), *_throttled(doc)]
    if doc["batch"] and doc["batch_sizes"]:
        n = doc["batch"]
        batches = (
            f"Batches: {n} arrays per rank in one `write_all_many` / `read_all_many` "
            f"(`collio-many`) or in {n} calls (the others); ms per batch."
        )
        if "ceiling" in doc["batch_apis"]:
            batches += (
                " `ceiling`: each rank's bytes of the batch in one `pwritev` (`preadv`) to a "
                "range of its own and one allreduce, which no collective call beats."
            )
        out += ["", *_wrap(batches)]
        for api, why in doc["unavailable"].items():
            out += ["", f"`{api}`: not run: {why}."]
        out += ["", *sweep_table(doc, "batch")]
    if doc["calls"]:
        out += ["", "Opening an existing file (`r+`), `sync()` with nothing written, `close()`:",
                "ms per call.", "", *sweep_table(doc, "file")]  # fmt: skip
    return out


def memory_table(docs: dict[str, dict[str, Any]]) -> list[str]:
    out = ["| job | API | peak RSS growth, aggregators (MiB) | bound (MiB) |"]
    out.append("| --- | --- | ---: | ---: |")
    for name, doc in docs.items():
        for api, check in doc.get("memory_checks", {}).items():
            cells = [name, api, f"{check['max_growth'] / MiB:.1f}", f"{check['limit'] / MiB:.0f}"]
            out.append("| " + " | ".join(cells) + " |")
    return out


def sim_table(docs: dict[str, dict[str, Any]]) -> list[str]:
    out = [
        "| command | path, method | aggregators, window | rounds | messages per round "
        "(min / mean / max) | wall | CPU |",
        "| --- | --- | --- | ---: | --- | ---: | ---: |",
    ]
    for name, doc in docs.items():
        if not name.startswith("sim-"):
            continue
        args = " ".join(command(doc).split()[1:]).replace("--simulate ", "")
        if doc["direct"]:  # requests are distinct sizes with their counts
            sizes = [
                r / MiB for r, k in zip(doc["requests"], doc["request_counts"], strict=True) if k
            ]
            n = sum(doc["request_counts"])
            path = f"direct ({n} requests of {min(sizes):.0f}-{max(sizes):.0f} MiB)"
            msgs, aggs = "-", "-"
        else:
            path = "two-phase, " + (
                f"**sampled** ({doc['windows_evaluated']} of {doc['windows_total']} windows)"
                if doc["sampled"]
                else doc["method"]
            )
            m = doc["messages_per_round"] or [0]
            msgs = f"{min(m)} / {statistics.fmean(m):.1f} / {max(m)}"
            aggs = f"{doc['aggregators']}, {doc['window'] / MiB:.0f} MiB"
        cells = [f"`{args}`", path, aggs, str(doc["rounds"]), msgs,
                 f"{doc['seconds']:.1f} s", f"{doc['cpu_seconds']:.1f} s"]  # fmt: skip
        out.append("| " + " | ".join(cells) + " |")
    return out


CONTROLS_PROSE = [
    "Every compute loop (alone, during the save's I/O, beside a control) starts on",
    "every rank together, after a barrier; during the I/O, once every rank's",
    "`async_save` has returned, so that the loop meets the background I/O and not",
    "other ranks still copying their state (the return's own figure). Each loop follows",
    "an untimed run of the same loop (a job's save follows its own work), the three in",
    "every order by turns. They are measured first as a job runs between its",
    "checkpoints, computing and saving in the background with nothing else (the target),",
    "then again in every iteration of all the methods, after the writers and the",
    "readers (`among the others`), where what their I/O left the machine to do meets",
    "them.",
    "The controls run the same compute loop while each rank's thread, at the save",
    "thread's priority, does the ceiling's write (`plain write`: one `pwrite` of its",
    "share and the `fsync`, no MPI, no checksum) or one numpy copy of its share",
    "(`thread copy`): the slowdown any background work brings on these cores, against",
    "which the save's own is the ratio of `compute during I/O` to `compute during plain",
    "write`; `thread CPU` is the CPU the background threads took during the loop,",
    "summed over the ranks, and its share of the cores' time in the loop; `loop",
    "blocked` is the time the loop's own thread spent neither running nor waiting for",
    "a core (its `schedstat`; the slowest rank): waiting for the GIL, which the",
    "background thread of its process held. The resharded controls are bandwidth",
    "ratios of the loads at half the ranks to the same-count loads.",
]


def checkpoint_table(docs: dict[str, dict[str, Any]]) -> list[str]:
    """The checkpoint job's medians and its targets (time ratios, as the issue states them)."""
    doc = docs.get("checkpoint")
    if doc is None:
        return ["(no checkpoint results yet)"]
    # (each iteration's time too, the first included: a save's time varies with the disk)
    lines = ["| method | median s | MiB/s | each iteration, s |", "|---|---:|---:|---|"]
    for row in doc["summary"]:
        each = " ".join(f"{t:.3f}" for t in doc["times"][row["api"]])
        lines.append(f"| {row['api']} | {row['median_time']:.3f} | {row['median']:.0f} | {each} |")
    for issue, head in ((True, "the issue's target"), (False, "stricter bound (not the issue's)")):
        rows = [t for t in doc["targets"] if t.get("issue", True) == issue]
        if not rows:
            continue
        lines += ["", f"| {head} | measured | bound | met |", "|---|---:|---:|---|"]
        for t in rows:
            rel = ">=" if t["at_least"] else "<="
            met = "yes" if t["met"] else "**no**"
            lines.append(f"| {t['target']} | {t['ratio']:.3f} | {rel} {t['bound']} | {met} |")
    # (the floor under the compute slowdown: the same loop beside a plain write or copy
    # thread at the save's priority, and the CPU the threads took during each loop)
    controls = doc.get("controls") or []
    if controls:
        lines += ["", *CONTROLS_PROSE, "", "| control (no target) | measured |", "|---|---:|"]
    for c in controls:
        got = (f"{c['ratio']:.3f}" if "ratio" in c else
               f"{c['seconds'] * 1e3:.1f} ms, {c['of_loop']:.1%} of the loop" if "of_loop" in c
               else f"{c['seconds'] * 1e3:.1f} ms, {c['of_cores']:.1%} of the cores")  # fmt: skip
        lines.append(f"| {c['control']} | {got} |")
    return [*lines, "", f"`{command(doc)}`, {doc['arrays']} arrays, {doc['nranks']} ranks."]


#: The checkpoint job run again with the replaced checkpoint freed beside the job, and
#: freed inside the commit (the default job reuses its blocks).
BACKGROUND = "checkpoint-background"
FREED = "checkpoint-free-in-commit"


def freed_table(docs: dict[str, dict[str, Any]]) -> list[str]:
    """The checkpoint job's targets and main medians with ``free_replaced`` as it is by
    default (``reuse`` for a save), with ``background`` and with ``commit``, side by
    side (jobs one after the other)."""
    jobs = [(h, docs[n]) for h, n in (("reuse (default)", "checkpoint"),
                                      ("background", BACKGROUND), ("commit", FREED))
            if n in docs]  # fmt: skip
    if len(jobs) < 2 or jobs[0][0] != "reuse (default)":
        return []
    lines = [
        "Where the replaced checkpoint is freed (hint `free_replaced`): the same job with the",
        "default for a save, `reuse` (next to nothing is freed: the replaced file stays beside",
        "the target as its spare, and the next save writes into its blocks; the disk holds a",
        "second checkpoint between saves, as it does during every atomic save), with",
        "`background` (a new file each save; rank 0 closes the old file in a thread of its own",
        "after the commit, and the file system frees its blocks beside the job: on this file",
        "system, mounted with `discard`, at the next journal commit, which the next save's",
        "flushes force) and with `commit` (the commit closes it and syncs the directory, every",
        "rank waiting), the jobs one after the other. `ceiling overwrite` is the ceiling's",
        "write into the blocks its file has, none freed or allocated: the bound of a save with",
        "`reuse`, as `ceiling write` (a new file) is of the others.",
        "",
        "| | " + " | ".join(h for h, _ in jobs) + " |",
        "|---|" + "---:|" * len(jobs),
    ]
    names = ("collio save", "async_save total", "compute during I/O", "compute alone",
             "ceiling write", "ceiling overwrite")  # fmt: skip
    for name in names:
        if all(name in d["times"] for _, d in jobs):
            got = " | ".join(f"{statistics.median(d['times'][name]):.3f}" for _, d in jobs)
            lines.append(f"| {name}, median s | {got} |")
    rows = [{t["target"]: t for t in d["targets"]} for _, d in jobs]
    for t in jobs[0][1]["targets"]:
        if all(t["target"] in r for r in rows):
            rel = ">=" if t["at_least"] else "<="
            got = " | ".join(_met(r[t["target"]]) for r in rows)
            what = t["target"] if t.get("issue", True) else f"stricter: {t['target']}"
            lines.append(f"| {what} ({rel} {t['bound']}) | {got} |")
    tail = ", ".join(f"`{command(d)}`" for _, d in jobs[1:])
    return [*lines, "", f"{tail}.", ""]


def _met(t: dict[str, Any]) -> str:
    return f"{t['ratio']:.3f}" if t["met"] else f"**{t['ratio']:.3f}**"


def errors(docs: dict[str, dict[str, Any]]) -> str:
    bad = [f"{n} ({d['errors']})" for n, d in docs.items() if d.get("errors")]
    if bad:
        return "Verification found errors in: " + ", ".join(bad) + "."
    return (
        "collio-bench verifies every API's first iteration (not the ceilings', which do not "
        "place the layout's bytes): `errors` is 0 in every JSON."
    )


def benchmarks_md(docs: dict[str, dict[str, Any]]) -> str:
    bench = [
        n for n in docs
        if not n.startswith(("sim-", "checkpoint")) and n not in CALIBRATE
    ]  # fmt: skip
    sims = [n for n in docs if n.startswith("sim-")]
    parts = [
        "# Measured",
        "",
        "Generated by `docs/make_benchmarks.py` from the JSON results in `docs/results/`, which",
        "`collio-bench --json` wrote; do not edit by hand. To measure again and rewrite every",
        "table: `docs/run_benchmarks.sh` (each job under the shared CPU lock; `ITER=12` for more",
        "iterations), or `python docs/make_benchmarks.py` to redo the tables alone.",
        "",
        "Bandwidth is the file's bytes over the barrier-to-barrier time of open + transfer +",
        "fsync + close, medians over the job's iterations, in which the APIs alternate in",
        "balanced orders; ratios are between medians of the same job. The test file is",
        "removed before each write, so every API writes a new file (IOR's default).",
        "4096 x 4096 float64",
        "(128 MiB) over 4 ranks unless said. `collio-shuffle` is collio reading through the",
        "two-phase shuffle (hint `mapped_reads=disable`); `ceiling` is each rank writing its",
        "1/p share as one contiguous `pwrite`, and reading it with one `preadv`. " + errors(docs),
        "",
        "## Arrays in one file (posix backend)",
        "",
        *arrays_table(docs),
        *provenance(docs, list(ARRAYS)),
        "",
        "## Time per call: a size sweep",
        "",
        *sweep_section(docs),
        *provenance(docs, [SWEEP]),
        "",
        "## MPICH's single-copy messages",
        "",
        "The same workloads in jobs with `MPIR_CVAR_CH4_CMA_ENABLE=0`, where every large",
        "message between ranks is copied twice through shared memory. Both the write and the",
        "shuffled read (`collio-shuffle`, whose bytes all travel as messages) pay for it.",
        "",
        *single_copy_table(docs),
        *provenance(docs, [j for pair in SINGLE_COPY.items() for j in pair]),
        "",
        "## Other targets",
        "",
        "`this / the first` is this API's median bandwidth over the job's first API's (collio).",
        "",
        *others_table(docs),
        *provenance(docs, list(OTHERS)),
        "",
        "## Two levels: 8 ranks as 2 emulated nodes",
        "",
        "`COLLIO_RANKS_PER_NODE=4` makes ranks 0-3 and 4-7 two nodes for collio (ROMIO sees",
        "one). `collio-two-level` and `collio-one-level` are collio with hint `cb_two_level`",
        "`enable` and `disable`, both reading through the shuffle (`mapped_reads=disable`);",
        "`collio` is the default (one level at this size, reads from the mapped file). On one",
        "machine every message is a copy in memory: the second level adds a copy into (reads:",
        "out of) the node's shared staging and a handoff per round between a node's ranks and",
        "its local aggregator, which ranks that outnumber the cores pay in turns, and its",
        "planning takes a few more collective steps (on a call's first plan: the calls after",
        "it reuse theirs). MiB/s, medians.",
        "",
        *two_level_table(docs),
        *provenance(docs, list(TWO_LEVEL)),
        "",
        "## Memory",
        "",
        "Peak RSS growth of collio's aggregators during collio's phases, against the bound",
        "2 x `cb_buffer_size` + 100 MiB.",
        "",
        *memory_table({n: docs[n] for n in bench}),
        "",
        "## Checkpoints",
        "",
        "`collio-bench --pattern checkpoint`: a transformer-like state (row shards, replicated",
        "norms) saved and loaded by `collio.checkpoint` and by the ways jobs save one today;",
        "slowest rank's barrier-to-barrier time, medians. `compute during I/O` is a numpy loop",
        "run while an `async_save` writes; `collio load` returns the pieces as arrays over a",
        "copy-on-write map of the file, `collio load copied` reads them into new arrays",
        "(hint `checkpoint_map=disable`), `collio load into` into the job's arrays",
        "(`(out, layout)` in the spec), `collio load 3 of N` loads with one rank fewer,",
        "`collio load half of N` with half the ranks (with two ranks a core, one rank fewer",
        "leaves one core a rank more to serve than the other, half leaves them even).",
        "The ceiling reads each rank's share of its file back by one `preadv`: `ceiling read`",
        "into memory the job already touched (the bound for a load into the job's arrays),",
        "`ceiling read new` into new arrays shaped as the rank's pieces (`np.empty` each, the",
        "same `preadv`: what a load that makes new arrays has to beat); a plain load is held",
        "to both. A load verifies every byte it returns: `ceiling read + checksum` is the",
        "same `preadv` into touched memory followed by the CRC-32 of its bytes (`by chunk`: each",
        "256 KiB chunk summed right after its read, as a load does), the bound no verified",
        "load can pass. `collio save unchecked` is the same save without checksums, run by",
        "turns with `collio save`: their ratio is what the checksums cost a save, which sums",
        "its pieces while the disk writes; `checksum` alone is the checksums' CPU time.",
        "This machine's virtual balloon device hands free memory back to the host (free",
        "page reporting): a write into new page cache faults its pages in from the host",
        "unless memory was freed just before, which costs several times the copy. A save",
        "writes a new file beside the checkpoint it replaces (dropping that one's cached",
        "pages first, `release_replaced`), while `ceiling write` and `file-per-rank` truncate",
        "and rewrite their own files; so each save's time also depends on what the job did",
        "before it (`times` in the JSON). Each writer replaces its own last output: `collio",
        "save`, `collio save unchecked` and `async_save` write a file each, and the loads",
        "read `collio save`'s.",
        "",
        *checkpoint_table(docs),
        "",
        *freed_table(docs),
        "## Simulator: 65,536 ranks",
        "",
        "Made by `collio-bench --simulate` with the arguments in the first column, on one",
        "process; wall time and the CPU time it needed.",
        "",
        *sim_table(docs),
        "",
        f"Machine: {machine(docs[sims[0]])}." if sims else "",
        "",
        "## Cost model: predicted time of a write at 65,536 ranks",
        "",
        "The simulator's plan of each strategy priced by `collio.sim.cost` (docs/design.md):",
        "collio with default hints in two levels and in one, and ROMIO's strategy (one",
        "aggregator per node, `cb_buffer_size` rounds, no overlap). `plan` is the simulator's",
        "time to plan the strategy.",
        "",
        *prediction_table(docs),
        "",
        cluster_line(docs),
        *calibration_section(docs),
    ]
    return "\n".join(parts).rstrip() + "\n"


def calibration_section(docs: dict[str, dict[str, Any]]) -> list[str]:
    if not any(n in docs for n in CALIBRATE):
        return []
    return [
        "",
        "## Cost model checked: predicted and measured 4- and 8-rank calls",
        "",
        "`collio-bench --calibrate` measures the model's terms in the same job as the calls",
        "it predicts: a core's memory copy bandwidth while every rank copies (the page",
        "cache's copies, which cannot hide behind the exchange when the ranks keep every",
        "core busy, a read's packing of small runs and a two-level group's staging: a",
        "round's copies run on every core at once and share the memory), MPI's bandwidth",
        "between two ranks and in a round (every rank sending to every other at once), a",
        "small message's cost and a run's (the",
        "other ranks asleep), what a rendezvous message (MPICH's single copy, 16 KiB and",
        "more) waits for its peer's turn with every rank polling (a round of 64 KiB",
        "messages beyond its bytes and a round of tiny ones), the time the ranks take to",
        "meet (each sends every other a tiny message, all polling), the cores per node, the",
        "ceiling's write and read bandwidth beyond its fixed cost (the storage), each",
        "API's fixed cost (`fixed cost`: the median of its calls on a 64 x 64 array), its",
        "cost per round (`a round's own`: its calls on that array cut into 8 rounds",
        "beyond its calls in one, less what the model prices for those rounds, per round:",
        "each rank's work for a round, the round's agreement and a two-level group's",
        "handoffs, with the waits for the ranks they need, paid in turns where ranks",
        "share cores; the meetings are in it) and its planning's cost per run (its calls",
        "on a 512 x 512 array in blocks of one element, as many runs a rank as the",
        "block-cyclic calls and few bytes, beyond the 64 x 64 array's and what the model",
        "prices for them, per run of the rank, or two-level group, that plans the most).",
        "Then it",
        "runs the calls (4096 x 4096 float64; medians of open + transfer + fsync + close",
        "over the job's iterations, at least 11 each: the first iterations on a new file",
        "can be several times as slow as the rest),",
        "plans each with the simulator on the hints it used and prices the plan with",
        "`collio.sim.cost` on that cluster, in which a node's ranks share its cores (emulated",
        "nodes share the machine's) and a node's link is its memory.",
        "",
        *calibration_table(docs),
        "",
        calibration_count(docs),
        "",
        *calibration_terms(docs),
        *provenance(docs, [n for n in CALIBRATE if n in docs]),
    ]


def readme_with_table(text: str, docs: dict[str, dict[str, Any]]) -> str:
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + "\n" + "\n".join(readme_table(docs)) + "\n" + text[end:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only check; exit 1 if out of date")
    args = ap.parse_args(argv)
    docs = load()
    want = {OUT: benchmarks_md(docs), README: readme_with_table(README.read_text(), docs)}
    stale = [p for p, text in want.items() if not p.exists() or p.read_text() != text]
    if args.check:
        for p in stale:
            print(f"{p.name} is not what docs/make_benchmarks.py makes from docs/results/")
        return 1 if stale else 0
    for p in stale:
        p.write_text(want[p])
    return 0


if __name__ == "__main__":
    sys.exit(main())
