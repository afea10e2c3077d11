"""Before/after on one machine: make bench's figures for an older commit and this tree, interleaved.

Two ``make bench`` runs twenty minutes apart disagree by 10-50% here: this
virtual machine's speed drifts, so a before/after of two whole runs measures
the drift. This script measures both trees in one run instead, figure by
figure and round by round, alternating which tree goes first, and reports the
median over rounds of the ratio after/before of the two measurements taken
side by side: drift slower than one pair of measurements cancels out.

Each measurement is a fresh child process (a time limit, and whatever it left
running is killed) whose ``PYTHONPATH`` puts one tree's ``ezpz_nb`` first:
``BASE`` is exported with ``git archive`` into a temporary folder (removed at
the end), "after" is this checkout as it is on disk. The measuring code is
this checkout's benchmarks for both, so only the package differs. A figure
the older tree cannot produce (a module it does not have yet) reads "failed"
on that side, and a column counts each side's failed rounds. Exits 1 when a
figure got more than 10% worse or fails more often after.

Figures (``--only`` picks some):

* ``launch``: ``ez.launch`` first call in a fresh process, later calls, a warm
  ``Cluster.run`` round trip, and memory (PSS) per rank, at ``--sizes`` ranks;
* ``kernel``: the first launch in a real Jupyter kernel 4 s after the import;
* ``broadcast``: the TP broadcast at tp 2, ours and the process group's raw
  broadcast interleaved in the same ranks (as ``broadcast.py``), so ours/raw
  is itself drift-free;
* ``plots``: build plus render time of each ``viz`` figure (32 ranks x 300 steps);
* ``doctor``: seconds until ``ezpz-nb doctor``'s verdict;
* ``notebooks``: each notebook under nbmake, each tree's own copy of the
  notebooks both trees have (``--notebooks`` picks some; ``--notebook-rounds``,
  default 1: a round of all of them takes minutes).

    python benchmarks/compare.py --base REV [--rounds 9] [--only launch kernel ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _procs import kill_tagged, new_tag, run_limited

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
FIGURES = ("launch", "kernel", "broadcast", "plots", "doctor", "notebooks")
WORSE = 1.10  # "after" slower than this times "before" is flagged


# ------------------------------------------------------------ in the child


def _child(name: str, world: int) -> dict[str, float]:
    """One measurement with whichever ezpz_nb PYTHONPATH selects: {figure: value}."""
    if name == "broadcast":
        import broadcast

        import ezpz_nb as ez

        blocks, per_block = 20, 20
        got = ez.launch(
            broadcast.bench_rank,
            broadcast.SHAPES,
            blocks,
            per_block,
            ("ours", "raw"),
            False,
            world_size=2,
            threads=1,
            timeout=600,
        )
        out = {}
        for b, s in broadcast.SHAPES:
            per = {
                m: broadcast._block_medians([r[(b, s, m)] for r in got], per_block)
                for m in ("ours", "raw")
            }
            out[f"broadcast {b}x{s} ours (ms)"] = statistics.median(per["ours"]) * 1e3
            out[f"broadcast {b}x{s} ours/raw"] = broadcast.paired_ratio(per["ours"], per["raw"])
        return out
    if name == "plots":
        import plot_speed

        ledger = plot_speed.build_ledger(32, 4, 300, 1, 1)
        times = plot_speed.time_figures(ledger, 32, 4)
        return {f"plot {fig} (s)": build + render for fig, (build, render, _) in times.items()}
    if name == "doctor":
        import doctor

        marks = doctor.one_run()
        if not marks.get("ok"):
            raise SystemExit("ezpz-nb doctor said NOT READY")
        return {"doctor verdict (s)": marks["verdict"]}
    if name == "notebooks":
        import notebooks

        folder = Path(os.environ["EZPZ_NB_COMPARE_TREE"]) / "notebooks"
        names = os.environ.get("EZPZ_NB_COMPARE_NOTEBOOKS", "").split()
        rows, wall, code = notebooks.run(folder, 120, names)
        if code != 0:
            raise SystemExit(f"a notebook failed: {rows}")
        return {f"notebook {nb} (s)": s for nb, s, _ in rows} | {"notebooks, whole run (s)": wall}
    raise SystemExit(f"unknown figure {name!r}")


# ------------------------------------------------------------ in the parent


def _measure(
    tree: Path, figure: str, world: int, limit_s: float, notebooks: list[str]
) -> dict[str, float] | str:
    """Run one measurement of ``figure`` in a child with ``tree`` first on the path."""
    env = dict(
        os.environ,
        PYTHONPATH=str(tree),
        EZPZ_NB_COMPARE_TREE=str(tree),
        EZPZ_NB_COMPARE_NOTEBOOKS=" ".join(notebooks),
    )
    if figure == "launch":
        cmd = ["launch.py", "--child", "ezpz", "--world", str(world), "--reps", "3"]
    elif figure == "kernel":
        cmd = ["launch.py", "--child", "kernel", "--world", str(world), "--reps", "1"]
    else:
        cmd = ["compare.py", "--child", figure, "--world", str(world)]
    tag = new_tag()
    try:
        status, out, _ = run_limited(
            [sys.executable, str(HERE / cmd[0]), *cmd[1:]],
            tag=tag,
            limit_s=limit_s,
            env=env,
            cwd=str(tree),  # a rank's sys.path starts with the working folder
        )
    finally:
        kill_tagged(tag)  # what a measurement left (or Ctrl-C interrupted) must not run on
    got = _last_json(out) if status == 0 else None
    if got is None:
        why = "hung" if status == "hung" else "failed"
        print(f"  {figure} ({world}) with {tree}: {why}\n{out[-1500:]}", file=sys.stderr)
        return why
    if figure == "launch":
        med = statistics.median
        return {
            f"launch {world} first (ms)": got["first"][0] * 1e3,
            f"launch {world} later (ms)": med(got["later"]) * 1e3,
            f"Cluster.run {world} warm (ms)": med(got["warm"]) * 1e3,
            f"PSS per rank {world} (MiB)": got["pss"][0],
        }
    if figure == "kernel":
        return {f"kernel first call {world} (ms)": got["times"][0] * 1e3}
    return got


def _last_json(out: str) -> dict[str, Any] | None:
    """The last line of ``out`` that is a JSON object (warnings may follow it)."""
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            try:
                got = json.loads(line)
            except ValueError:
                continue
            if isinstance(got, dict):
                return got
    return None


def _which_ezpz(tree: Path) -> str:
    """Where a rank started from ``tree``'s launcher imports ezpz_nb from (must be ``tree``)."""
    code = (
        "import ezpz_nb as ez\n"
        "def where():\n    import ezpz_nb\n    return ezpz_nb.__file__\n"
        "print(ez.launch(where, world_size=1)[0])"
    )
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=str(tree),  # python -c puts the working folder first on sys.path
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise SystemExit(f"cannot launch with {tree}:\n{done.stderr[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


def _export(rev: str, into: Path) -> str:
    """Write commit ``rev``'s tree into ``into``; return its short hash."""
    git = ["git", "-C", str(ROOT)]
    short = subprocess.run(
        [*git, "rev-parse", "--short", f"{rev}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if short.returncode != 0:
        raise SystemExit(f"--base {rev!r} is not a commit of {ROOT}: {short.stderr.strip()}")
    archive = subprocess.run([*git, "archive", rev], capture_output=True)  # a few MB
    if archive.returncode != 0:
        raise SystemExit(f"git archive {rev} failed: {archive.stderr.decode()[-500:]}")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return short.stdout.strip()


def _num(x: float) -> str:
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.3g}"


def _table(results: dict[str, dict[str, list[float | str]]], label: dict[str, str]) -> bool:
    """Print the table; return True when something got worse or failed only after."""
    print(
        f"| figure | before ({label['before']}) | after ({label['after']}) | after/before "
        "| failed (before / after) | |"
    )
    print("|---|---:|---:|---:|---|---|")
    bad = False
    for key, per_tree in results.items():
        before, after = per_tree["before"], per_tree["after"]
        pairs = [
            (b, a)
            for b, a in zip(before, after, strict=True)
            if isinstance(b, float) and isinstance(a, float)
        ]
        failed = {name: sum(isinstance(x, str) for x in v) for name, v in per_tree.items()}
        # Each side's median over its own successful rounds; the ratio only over pairs.
        shown = [
            _num(statistics.median(nums)) if nums else next(x for x in v if isinstance(x, str))
            for v in (before, after)
            for nums in [[x for x in v if isinstance(x, float)]]
        ]
        ratio = statistics.median(a / b for b, a in pairs) if pairs else None
        notes = []
        # Every figure here is a time, a memory or a time ratio: higher is worse.
        if ratio is not None and ratio > WORSE:
            notes.append(f"**{(ratio - 1) * 100:.0f}% worse**")
        if failed["after"] > failed["before"]:
            notes.append("**fails more after**")
        bad = bad or bool(notes)
        print(
            f"| {key} | {shown[0]} | {shown[1]} | "
            f"{f'{ratio:.2f}x' if ratio is not None else 'n/a'} | "
            f"{failed['before']} / {failed['after']} of {len(before)} | {' '.join(notes)} |"
        )
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", help="the commit to compare with (a hash, tag or HEAD~3)")
    ap.add_argument(
        "--rounds",
        type=int,
        default=9,
        help="pairs of measurements per figure (5 flagged 13%% on noise here; 11 did not)",
    )
    ap.add_argument("--notebook-rounds", type=int, default=1)
    ap.add_argument("--notebooks", nargs="+", default=[], help="only these notebooks (file names)")
    ap.add_argument("--sizes", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--only", nargs="+", choices=FIGURES, default=list(FIGURES))
    ap.add_argument("--limit", type=float, default=600.0, help="seconds one measurement may take")
    ap.add_argument("--child", choices=FIGURES, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, default=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.world)))
        return 0
    if not args.base:
        ap.error("--base REV is required (the commit to compare this tree with)")
    if args.rounds < 1 or args.notebook_rounds < 0:
        ap.error("--rounds must be >= 1 and --notebook-rounds >= 0")
    if min(args.sizes) < 1 or args.limit <= 0:
        ap.error("--sizes must be >= 1 and --limit > 0")

    with tempfile.TemporaryDirectory(prefix="ezpz_nb-compare-") as tmp:
        base = Path(tmp)
        trees = {"before": base, "after": ROOT}
        label = {"before": _export(args.base, base)}
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--", "ezpz_nb", "notebooks"],
            capture_output=True,
            text=True,
        ).stdout
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        label["after"] = head + (" + uncommitted changes" if dirty else "")
        for name, tree in trees.items():
            where = _which_ezpz(tree)
            if not Path(where).resolve().is_relative_to(tree.resolve()):
                raise SystemExit(f"{name}: ranks import ezpz_nb from {where}, not from {tree}")
        # The same notebooks on both sides, so that "whole run" compares like with like.
        notebooks = args.notebooks or sorted(
            set.intersection(
                *({p.name for p in (t / "notebooks").glob("*.ipynb")} for t in trees.values())
            )
        )

        plan: list[tuple[str, int]] = []
        for figure in args.only:
            worlds = args.sizes if figure == "launch" else [4] if figure == "kernel" else [2]
            plan += [(figure, w) for w in worlds]
        results: dict[str, dict[str, list[float | str]]] = {}
        start = time.monotonic()
        for figure, world in plan:
            rounds = args.notebook_rounds if figure == "notebooks" else args.rounds
            for r in range(rounds):
                # Alternate who goes first, so that neither always meets a warmer machine.
                order = ("before", "after") if r % 2 == 0 else ("after", "before")
                got = {
                    name: _measure(trees[name], figure, world, args.limit, notebooks)
                    for name in order
                }
                # The figures either side measured; both failed: one row says so.
                keys = list(
                    dict.fromkeys(k for g in got.values() if isinstance(g, dict) for k in g)
                )
                keys = keys or [f"{figure} ({world} ranks)" if figure != "notebooks" else figure]
                for key in keys:
                    for name in trees:
                        g = got[name]
                        value = g.get(key, "n/a") if isinstance(g, dict) else g
                        results.setdefault(key, {"before": [], "after": []})[name].append(value)
            ranks = f" ({world} ranks)" if figure in ("launch", "kernel", "broadcast") else ""
            took = time.monotonic() - start
            print(f"  {figure}{ranks}: done at {took:.0f} s", file=sys.stderr)

    bad = _table(results, label)
    print(
        f"\n{args.rounds} pair(s) per figure ({args.notebook_rounds} for notebooks), each "
        "measurement in a fresh process, the two trees alternating who goes first. "
        "before, after: each side's median over its rounds that succeeded; after/before: "
        "the median over pairs of the ratio of the two side by side. "
        f"Flagged: more than {(WORSE - 1) * 100:.0f}% worse, or failing more often after "
        f"(then the exit status is 1). Machine: {os.cpu_count()} cores."
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
