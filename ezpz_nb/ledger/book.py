"""All ranks' records in one :class:`Ledger`: load, merge, save, check, summarise."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ezpz_nb.ledger import codec
from ezpz_nb.ledger.checks import Problem, check_records
from ezpz_nb.ledger.memory import MemoryReport, MemorySample, summarise
from ezpz_nb.ledger.records import StepRecord
from ezpz_nb.ledger.timing import Diagnosis, StepTiming, diagnose, epoch_start, step_timings

__all__ = ["Ledger"]


def _read_file(file: Path) -> Ledger:
    """One ledger file, of any version the codec reads."""
    got = codec.decode(file.read_text(encoding="utf-8"), name=str(file))
    return Ledger(got.records, got.num_samples, got.complete)


@dataclass
class Ledger:
    """All ranks' step records, and checks over them.

    Attributes:
        records: The :class:`StepRecord` s, in any order.
        num_samples: Dataset length, if known (needed for the ``never_seen`` check).
        complete: ``{rank: finished}`` for the ranks whose files were read
            (:meth:`load`): False when a rank's file has no end record, because
            the rank was killed or stopped by an error. Empty when unknown.
        memory: Memory samples of the ranks and their DataLoader workers
            (``record(..., memory=True)``); kept in memory only, not in files.
    """

    records: list[StepRecord] = field(default_factory=list)
    num_samples: int | None = None
    # How a run ended is not what it recorded: two ledgers with the same
    # records compare equal whether or not they came from files.
    complete: dict[int, bool] = field(default_factory=dict, compare=False)
    memory: list[MemorySample] = field(default_factory=list, compare=False)

    # -------------------------------------------------------------- building
    @classmethod
    def from_results(cls, results: Iterable[Any], *, num_samples: int | None = None) -> Ledger:
        """Merge what the ranks returned from ``ez.launch``/``Cluster.run``.

        Args:
            results: One item per rank, each a :class:`Ledger` (from
                :meth:`RecordingLoader.ledger`), a :class:`StepRecord`, or a
                (nested) list/tuple of them.
            num_samples: Dataset length; defaults to the largest one the parts know.
        """
        records: list[StepRecord] = []
        sizes: list[int] = []
        complete: dict[int, bool] = {}
        memory: list[MemorySample] = []

        def take(item: Any) -> None:
            if isinstance(item, StepRecord):
                records.append(item)
            elif isinstance(item, Ledger):
                records.extend(item.records)
                memory.extend(item.memory)
                if item.num_samples is not None:
                    sizes.append(item.num_samples)
                for r, done in item.complete.items():
                    complete[r] = complete.get(r, True) and done
            elif isinstance(item, (list, tuple)):
                for x in item:
                    take(x)
            else:
                raise TypeError(
                    f"expected Ledger, StepRecord or a list of them, got {type(item).__name__}"
                )

        take(list(results))
        size = num_samples if num_samples is not None else max(sizes, default=None)
        return cls(records, size, complete, memory)

    @classmethod
    def merge_runs(cls, *runs: Ledger) -> Ledger:
        """One job that ran in several parts (stopped, then resumed), as one ledger.

        A resumed run's loader starts counting steps at 0 again, so each part's
        steps in an epoch are moved to follow those that the earlier parts took
        in that epoch (the most any rank took). Then the checks read the job as
        one epoch: a sample that the restart repeated is a ``dp_duplicate`` (or
        a ``rank_duplicate``), one it skipped is ``never_seen``.

        Args:
            runs: The parts' ledgers, in the order they ran. The world size
                may differ between them.

        Returns:
            A new ledger; :attr:`complete` says, for each rank, how the last
            part that had it ended.
        """
        records: list[StepRecord] = []
        taken: dict[int, int] = {}  # epoch -> steps taken by the parts so far
        complete: dict[int, bool] = {}
        sizes = [run.num_samples for run in runs if run.num_samples is not None]
        for run in runs:
            shift = dict(taken)
            for r in run.records:
                step = r.step + shift.get(r.epoch, 0)
                records.append(replace(r, step=step))
                taken[r.epoch] = max(taken.get(r.epoch, 0), step + 1)
            complete.update(run.complete)
        return cls(records, max(sizes, default=None), complete)

    @classmethod
    def from_events(cls, events: Iterable[Any], *, num_samples: int | None = None) -> Ledger:
        """Rebuild a (possibly partial) ledger from the launcher's published events.

        Args:
            events: Objects with ``.rank`` and ``.item`` (``RankError.events``,
                ``HangError.events``); items that are not StepRecords are skipped.
            num_samples: Dataset length, if known.
        """
        return cls(
            [e.item for e in events if isinstance(getattr(e, "item", None), StepRecord)],
            num_samples,
        )

    def save(self, path: str | Path) -> Path:
        """Write the ledger as one file (see the module docstring for the format).

        Every rank gets an end record unless :attr:`complete` says it did not
        finish. Under torchrun, let each rank write its own file as it goes
        instead (``record(..., path=f"{dir}/rank{rank}.jsonl")``); :meth:`load`
        merges a folder of them.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        steps: dict[int, int] = dict.fromkeys(self.complete, 0)
        with path.open("w", encoding="utf-8") as f:
            f.write(codec.encode_header(self.num_samples))
            for r in self.records:
                f.write(codec.encode_step(r))
                if r.loss is not None:
                    f.write(codec.encode_loss(r))
                if r.times is not None:
                    f.write(codec.encode_times(r))
                steps[r.rank] = steps.get(r.rank, 0) + 1
            for rank, n in sorted(steps.items()):
                if self.complete.get(rank, True):
                    f.write(codec.encode_end(rank, n))
        return path

    @classmethod
    def load(cls, path: str | Path) -> Ledger:
        """Read a ledger file, or merge every ``*.jsonl`` in a folder.

        A file cut short (its rank killed) loads with the steps it holds: a
        torn last line is dropped, and :attr:`complete` is False for its rank.

        Raises:
            FileNotFoundError: No such file, or no ``*.jsonl`` in the folder.
            ValueError: A line other than the last is not JSON, or the file
                is of a newer format version.
        """
        path = Path(path)
        files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
        if not files:
            raise FileNotFoundError(f"no *.jsonl ledger files in {path}")
        return cls.from_results([_read_file(file) for file in files])

    # ------------------------------------------------------------- accessors
    def __len__(self) -> int:
        return len(self.records)

    def ranks(self) -> list[int]:
        """Global ranks that recorded anything, sorted."""
        return sorted({r.rank for r in self.records})

    def epochs(self) -> list[int]:
        """Epoch labels present, sorted."""
        return sorted({r.epoch for r in self.records})

    def layout(self) -> dict[int, tuple[int, int]]:
        """``{rank: (dp_rank, tp_rank)}`` as recorded."""
        return {r.rank: (r.dp_rank, r.tp_rank) for r in self.records}

    def last_step(self, rank: int) -> tuple[int, int] | None:
        """``(epoch, step)`` of the last step ``rank`` recorded, or None if it recorded none."""
        return max(((r.epoch, r.step) for r in self.records if r.rank == rank), default=None)

    def losses(self, rank: int | None = None) -> list[tuple[int, int, float]]:
        """``(epoch, step, loss)`` of every step with a loss, in order.

        Args:
            rank: Whose losses; by default the lowest rank that logged any (a
                training loop averages the loss over the ranks, so all agree).
        """
        logged = [r for r in self.records if r.loss is not None]
        if rank is None:
            rank = min((r.rank for r in logged), default=0)
        return sorted(
            (r.epoch, r.step, float(r.loss))
            for r in logged
            if r.rank == rank and r.loss is not None
        )

    def steps(self, rank: int, epoch: int) -> list[StepRecord]:
        """The records of ``rank`` in ``epoch``, by step."""
        return sorted(
            (r for r in self.records if r.rank == rank and r.epoch == epoch), key=lambda r: r.step
        )

    def sample_ids(self, rank: int, epoch: int) -> list[int]:
        """Every sample id ``rank`` held in ``epoch``, in step order."""
        return [i for r in self.steps(rank, epoch) for i in r.sample_ids]

    def sample_matrix(self, epoch: int) -> Any:
        """Sample ids as a ``(ranks, steps, batch)`` int64 numpy array, -1 where absent.

        Rows follow :meth:`ranks`; ranks with fewer steps or smaller batches are padded.
        """
        import numpy as np

        # One pass over the records: plots call this on 64 ranks x 1000 steps.
        ranks = self.ranks()
        row = {r: i for i, r in enumerate(ranks)}
        recs = [r for r in self.records if r.epoch == epoch]
        n_steps = max((r.step + 1 for r in recs), default=0)
        width = max((len(r.sample_ids) for r in recs), default=0)
        out = np.full((len(ranks), n_steps, width), -1, dtype=np.int64)
        for r in recs:
            out[row[r.rank], r.step, : len(r.sample_ids)] = r.sample_ids
        return out

    # --------------------------------------------------------------- timings
    def timings(self, epoch: int | None = None) -> list[StepTiming]:
        """Each rank's step times with its wait for the last rank (see :mod:`~ezpz_nb.ledger.timing`).

        Args:
            epoch: Only this epoch; by default all.

        Returns:
            One :class:`~ezpz_nb.ledger.StepTiming` per timed record, by epoch,
            step and rank; empty when the run recorded no times.
        """
        recs = self.records if epoch is None else [r for r in self.records if r.epoch == epoch]
        return step_timings(recs)

    def diagnose(self) -> Diagnosis:
        """Which rank is the straggler, each rank's data-wait share, and who waits: in words.

        ``print(ledger.diagnose())`` gives the verdict; its attributes give the figures.
        """
        return diagnose(self.records)

    def epoch_start(self) -> dict[int, dict[int, float]]:
        """``{epoch: {rank: data wait of its first step}}``: what each epoch's start costs."""
        return epoch_start(self.records)

    def memory_report(self) -> MemoryReport:
        """Private memory of each rank and DataLoader worker: start, peak, growth.

        ``print(ledger.memory_report())`` gives a table; empty unless the run was
        recorded with ``record(..., memory=True)``. Why *private* memory, and
        what makes a forked worker's grow: :mod:`ezpz_nb.ledger.memory`.
        """
        return MemoryReport(summarise(self.memory))

    # ---------------------------------------------------------------- checks
    def check(self) -> list[Problem]:
        """Look for the ways DP/TP data loading goes wrong (see :mod:`ezpz_nb.ledger.checks`).

        Returns:
            One :class:`~ezpz_nb.ledger.checks.Problem` per kind and epoch found, empty
            when all is well.
        """
        return check_records(self.records, self.num_samples)

    @property
    def ok(self) -> bool:
        """True when :meth:`check` finds nothing."""
        return not self.check()

    def summary(self) -> str:
        """A few lines: what was recorded and what :meth:`check` found."""
        ranks = self.ranks()
        dp = max((r.dp_size for r in self.records), default=0)
        tp = max((r.tp_size for r in self.records), default=0)
        cp = max((r.cp_size for r in self.records), default=1)
        grid = f"dp {dp} x cp {cp} x tp {tp}" if cp > 1 else f"dp {dp} x tp {tp}"
        lines = [
            f"Ledger: {len(ranks)} rank(s) ({grid}), epochs {self.epochs()}, "
            f"{len(self.records)} step records, "
            f"{len({i for r in self.records for i in r.sample_ids})} distinct samples"
            + (f" of {self.num_samples}" if self.num_samples is not None else "")
        ]
        cut = sorted(r for r, done in self.complete.items() if not done)
        for r in cut:
            last = self.last_step(r)
            where = (
                f"its last step was epoch {last[0]} step {last[1]}" if last else "it took no step"
            )
            lines.append(
                f"- incomplete: rank {r} wrote no end record ({where}): it was killed or "
                "stopped by an error, see its output"
            )
        problems = self.check()
        lines += [f"- {p.kind}: {p.message}" for p in problems] or [
            "All checks passed on what was recorded." if cut else "All checks passed."
        ]
        # Broken between words here: JupyterLab's output area breaks long lines anywhere,
        # in the middle of a word (word-break: break-all), 848 px being ~108 characters.
        return "\n".join(
            textwrap.fill(line, 96, subsequent_indent="  ", break_on_hyphens=False)
            for line in lines
        )
