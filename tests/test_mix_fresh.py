"""Notebook 17's checker (ezpz_nb.workshop.mixture), its new Python process and its far
windows: the stream computed again in a process of its own (its own hash salt, no file the
ranks wrote, nothing left behind), and the far steps' windows. Split from
``test_mix_exercise.py`` so the two halves run on two workers of ``make unit``.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import types

import pytest
from _mix_answers import (
    DRAWS_BEFORE_SOURCE,
    cached_epoch,
    exact_then_estimated,
    grouped_by_source,
    library_answer,
    notebook_solution,
    replays_16384_batches,
    replays_from,
)
from _mix_check import DRAWS
from _mix_check import rejected as _rejected

import ezpz_nb as ez
from ezpz_nb.data.mixture import Mixture
from ezpz_nb.launcher.startup import pack_job
from ezpz_nb.workshop.mix_confine import not_confined
from ezpz_nb.workshop.mix_fresh import FreshStream, hash_seed
from ezpz_nb.workshop.mix_streams import (
    draw_setup,
)
from ezpz_nb.workshop.mix_window import WINDOW, WINDOWS, far_rules
from ezpz_nb.workshop.mixture import check_mix_batch


@pytest.fixture(scope="module")
def cluster():
    with ez.Cluster(4, timeout=60) as c:
        yield c


def _defined_in_a_cell(src: str, name: str | None):
    """``name`` from ``src`` (every name when None), defined as a notebook cell defines it
    (``__main__``: it travels by value, so a new process imports numpy alone, as for a
    learner's answer)."""
    ns: dict = {"__name__": "__main__"}
    exec(compile(src, f"<17 {name} cell>", "exec"), ns)
    return ns if name is None else ns[name]


#: The notebook's solution with its generators seeded by ``SEED_OF`` (defined before it), its
#: running totals the notebook's own (kept between calls: the far windows are past 2**16).
_SOLUTION_WITH = (
    "import numpy as np\n"
    + DRAWS_BEFORE_SOURCE
    + "def mix_batch(sizes, weights, global_batch, step, dp_rank, dp_size, seed):\n"
    "    w = tuple(x / sum(weights) for x in weights)\n"
    "    done, quota = draws_before(w, global_batch, step)\n"
    "    slots = np.repeat(np.arange(len(w)), quota)\n"
    "    order = np.random.default_rng(SEED_OF(seed, step, -1)).permutation(slots)\n"
    "    out = []\n"
    "    for s in order:\n"
    "        n, size = done[s], sizes[s]\n"
    "        perm = np.random.default_rng(SEED_OF(seed, int(s), n // size)).permutation(size)\n"
    "        out.append((int(s), int(perm[n % size])))\n"
    "        done[s] += 1\n"
    "    m = global_batch // dp_size\n"
    "    return out[dp_rank * m : (dp_rank + 1) * m]\n"
)

#: Dodge (issue 45's sixth trial, defect 5): every generator seeded by hash() of a str, which
#: Python salts per interpreter. Every rank of a check descends from one forkserver and
#: shares its salt, so all layouts agree; a restarted job draws another stream.
seeded_by_str_hash = _defined_in_a_cell(
    "def SEED_OF(seed, a, b):\n    return hash(f'{seed}/{a}/{b}') & (2**63 - 1)\n" + _SOLUTION_WITH,
    "mix_batch",
)
#: Dodge (sixth trial, defect 6): a salt an earlier cell planted in the warm cluster's ranks
#: (:func:`_plant_salt`), mixed into every seed: the same on every rank and worker, another
#: one in the next session.
seeded_by_a_planted_salt = _defined_in_a_cell(
    "import sys\n"
    "def SEED_OF(seed, a, b):\n"
    "    salt = getattr(sys.modules['ezpz_nb'], '_planted_salt', 0)\n"
    "    return [seed, a + 1, b + 1, salt]\n" + _SOLUTION_WITH,
    "mix_batch",
)
#: Right, unusually: the same answer seeded by sha256 of the same str (the same in every
#: process), and random.Random(str) is in ``cached_epoch``.
_SEEDED_BY_SHA256 = (
    "import hashlib\n"
    "def SEED_OF(seed, a, b):\n"
    "    return int.from_bytes(hashlib.sha256(f'{seed}/{a}/{b}'.encode()).digest()[:8], 'big')\n"
    + _SOLUTION_WITH
)
seeded_by_str_sha256 = _defined_in_a_cell(_SEEDED_BY_SHA256, "mix_batch")


def _plant_salt(salt):
    """An earlier cell's work on the warm ranks (the salt kept in a module they keep)."""
    import sys

    sys.modules["ezpz_nb"]._planted_salt = salt


def test_a_stream_that_depends_on_the_process_is_rejected(cluster):
    """Guards issue 45's sixth trial, defects 5 and 6: permutations seeded by hash() of a str
    (salted per interpreter, shared by every rank of one forkserver) and a salt planted in the
    warm ranks by an earlier cell both passed, as every layout ran on the same ranks. The
    horizon and a far run, computed again in a new process with another PYTHONHASHSEED,
    must be the ranks' batches; the same answer seeded by sha256 of the same str passes."""
    for _ in range(max(1, DRAWS // 2)):
        got = check_mix_batch(seeded_by_str_hash, cluster=cluster)
        assert got.status == "wrong" and "in a new Python process" in got.message, got.message
    cluster.run(_plant_salt, 2**40 + 12345)
    try:
        got = check_mix_batch(seeded_by_a_planted_salt, cluster=cluster)
        assert got.status == "wrong" and "in a new Python process" in got.message, got.message
    finally:
        cluster.run(_plant_salt, 0)
    got = check_mix_batch(seeded_by_str_sha256, cluster=cluster)
    assert got.status == "correct", got.message


#: Rule 6's probes, defined as cells define them (by value: a new process imports no test
#: module): this process's hash of a str as one pair (its salt, seen from outside), a
#: function that raises at step 1, and one that never returns.
_PROBES = _defined_in_a_cell(
    "import time\n"
    "def _hash_of(sizes, weights, global_batch, step, dp_rank, dp_size, seed):\n"
    "    return [(0, hash(f'ezpz_nb {seed}') & 0xFFFFFFFF)]\n"
    "def _fails_at_step_1(sizes, weights, global_batch, step, dp_rank, dp_size, seed):\n"
    "    if step == 1:\n"
    "        raise KeyError('only the ranks have it')\n"
    "    return [(0, 0)]\n"
    "def _never_returns(sizes, weights, global_batch, step, dp_rank, dp_size, seed):\n"
    "    time.sleep(60)\n",
    None,
)
_hash_of, _fails_at_step_1, _never_returns = (
    _PROBES[name] for name in ("_hash_of", "_fails_at_step_1", "_never_returns")
)


def _fresh_stream(fn, hash_seed, timeout=60.0):
    return FreshStream(pack_job(fn, (), {}), ((3,), (1.0,), 1, 7), [0, 1], hash_seed, timeout)


def test_the_new_process_has_its_own_hash_salt_and_says_what_went_wrong():
    """Guards rule 6's own premise, in process (no ranks): the new process runs with the
    drawn PYTHONHASHSEED (two seeds give two salts, one seed the same one), never the
    kernel's setting; a function that raises there is
    said with its exception and line, one that does not return is stopped at the timeout
    (not judged, never wrong), and no process is left."""
    with _fresh_stream(_hash_of, 1) as a, _fresh_stream(_hash_of, 2) as b:
        with _fresh_stream(_hash_of, 1) as c:
            one, two, again = a.batches(), b.batches(), c.batches()
    assert one == again != two
    with _fresh_stream(_fails_at_step_1, 3) as f, pytest.raises(RuntimeError) as err:
        f.batches()
    assert "KeyError" in str(err.value) and "only the ranks have it" in str(err.value)
    stream = _fresh_stream(_never_returns, 4, timeout=0.5)
    with pytest.raises(TimeoutError, match="did not return within"):
        stream.batches()
    assert stream._proc.poll() is not None  # stopped, not left running
    picks = iter([5, 5, 6])
    assert hash_seed(types.SimpleNamespace(randrange=lambda a, b: next(picks)), "5") == 6


def test_the_seventh_trials_far_dodges_are_rejected(cluster):
    """Guards issue 45's seventh trial: a table of 16384 global batches replayed (H1: past
    every step then asked) and a stream exact to step 1024, then the same rounding each batch
    with pass positions guessed from the weights (H2: each far batch within one sample)
    passed. The far windows past 2**16 judge the running totals and the passes for every
    count of draws a right stream could have before them (offline: 200 of 200 draws each)."""
    for fn in (replays_16384_batches, exact_then_estimated):
        _rejected(cluster, fn, "far out", max(1, DRAWS // 2))


@pytest.mark.parametrize("seed", [21, 22])
def test_the_window_rule_keeps_right_answers_and_turns_far_dodges_down(seed):
    """Guards the window rule on its own, in process (no ranks): right answers with other
    permutations, orders and caches (the library's, the notebook's, the sources' blocks side
    by side, random.Random(str) from lru_cache'd totals) keep it in both windows of a draw;
    H1, H2 and a table of 65536 batches break it; and a right window judged as if it started
    a step later (its running totals and passes one batch off) breaks it."""
    setup = draw_setup(seed)
    main = setup.main
    args = (main.sizes, main.weights, main.global_batch)

    def judged(fn, start, at=None):
        window = [list(map(tuple, fn(*args, b, 0, 1, seed))) for b in range(start, start + WINDOW)]
        return far_rules(window, start if at is None else at, main.weights, main.sizes)

    for fn in (library_answer, notebook_solution, grouped_by_source, cached_epoch):
        assert [judged(fn, p) for p in setup.windows] == [""] * WINDOWS, fn
    for fn in (replays_16384_batches, exact_then_estimated, replays_from(65536)):
        assert "far out" in judged(fn, setup.windows[-1]), fn
    assert "far out" in judged(notebook_solution, setup.windows[0], setup.windows[0] + 1)


def test_the_library_answer_is_the_librarys_plan():
    """Guards what ``library_answer`` stands for: computed batch by batch (the library's
    whole plan costs seconds past 2**16), it is ``Mixture.plan``'s stream, batch for batch."""
    for seed in range(3):
        main = draw_setup(seed).main
        g = main.global_batch
        plan = Mixture(main.sizes, main.weights, g, "stratified", seed).plan(40)
        for b in range(40):
            got = library_answer(main.sizes, main.weights, g, b, 0, 1, seed)
            assert got == [(int(s), int(i)) for s, i in plan[b * g : (b + 1) * g]], (seed, b)


#: Where the ninth trial's dodges keep what the ranks and the new process share: the
#: machine's temporary folder, as the trial's (one folder per test process).
_SHARED = os.path.join(tempfile.gettempdir(), f"ezpz_nb-t9-mix-{os.getpid()}")

#: The notebook's solution seeded by hash() of a str (salted per process), each global batch
#: computed once by the salted stream, kept in a shared folder and read back from there.
_SALTED_AND_CACHED = (
    "import hashlib, json, os, time\n"
    "import torch.distributed\n"
    "import torch.utils.data\n"
    "def SEED_OF(seed, a, b):\n    return hash(f'{seed}/{a}/{b}') & (2**63 - 1)\n"
    + _SOLUTION_WITH.replace("def mix_batch(", "def salted(")
    + "def _cached(path, make):\n"
    "    if not os.path.exists(path):\n"
    "        os.makedirs(CACHE, exist_ok=True)\n"
    "        tmp = f'{path}.{os.getpid()}'\n"
    "        with open(tmp, 'w') as f:\n"
    "            json.dump(make(), f)\n"
    "        try:\n"
    "            os.link(tmp, path)  # first writer wins\n"
    "        except FileExistsError:\n"
    "            pass\n"
    "        os.remove(tmp)\n"
    "    with open(path) as f:\n"
    "        return json.load(f)\n"
)


def _waiting(cache: str, make_first: bool):
    """Dodge (issue 45's ninth trial, d17_salted_hash_waits_for_ranks): a caller that is
    neither a rank nor a loader worker (the checker's new process) waits for the ranks'
    batch in ``cache`` instead of computing its own with its own salt; ``make_first``: it
    makes the folder first, as the trial's did."""
    return _defined_in_a_cell(
        f"CACHE, MAKE_FIRST = {cache!r}, {make_first}\n"
        + _SALTED_AND_CACHED
        + "def mix_batch(sizes, weights, global_batch, step, dp_rank, dp_size, seed):\n"
        "    key = repr((list(sizes), list(weights), global_batch, step, seed)).encode()\n"
        "    path = os.path.join(CACHE, hashlib.sha1(key).hexdigest())\n"
        "    if MAKE_FIRST:\n"
        "        os.makedirs(CACHE, exist_ok=True)\n"
        "    if torch.utils.data.get_worker_info() is None and not torch.distributed.is_initialized():\n"
        "        for _ in range(1200):\n"
        "            if os.path.exists(path):\n"
        "                break\n"
        "            time.sleep(0.05)\n"
        "    whole = _cached(path, lambda: salted(sizes, weights, global_batch, step, 0, 1, seed))\n"
        "    m = global_batch // dp_size\n"
        "    return [tuple(x) for x in whole[dp_rank * m : (dp_rank + 1) * m]]\n",
        "mix_batch",
    )


waits_for_the_ranks = _waiting(_SHARED, True)

#: Dodge (the reverse way): the first process to call, most often the new one, draws a salt
#: and leaves it in the shared folder; every other process takes it, so all agree.
takes_the_first_salt = _defined_in_a_cell(
    f"CACHE = {_SHARED!r}\n"
    + _SALTED_AND_CACHED.replace("def SEED_OF(seed, a, b):", "def _unused(seed, a, b):")
    + "def SEED_OF(seed, a, b):\n"
    "    salt = _cached(os.path.join(CACHE, 'salt'), lambda: int.from_bytes(os.urandom(7), 'big'))\n"
    "    return [seed, a + 1, b + 1, salt]\n"
    "def mix_batch(*args):\n"
    "    return salted(*args)\n",
    "mix_batch",
)


def test_the_new_process_cannot_read_what_the_ranks_write_nor_leave_them_anything(cluster):
    """Guards issue 45's ninth trial: the new process of rule 6, started beside the ranks,
    waited for the batches they cached in /tmp (a stream seeded by the salted hash() of a
    str passed, 2 of 2). It now answers before any rank runs and may neither read a shared
    place nor write anything, so that dodge fails on every draw; and so does the reverse, a
    salt the first process leaves for the others (rmtree: each draw starts with no folder,
    as the trial did)."""
    try:
        for fn in [waits_for_the_ranks] * DRAWS + [takes_the_first_salt] * max(1, DRAWS // 2):
            shutil.rmtree(_SHARED, ignore_errors=True)
            got = check_mix_batch(fn, cluster=cluster)
            assert got.status == "wrong" and "in a new Python process" in got.message, got.message
    finally:
        shutil.rmtree(_SHARED, ignore_errors=True)


def test_the_new_process_answers_before_the_ranks_write(cluster, tmp_path, monkeypatch):
    """Guards the order of rule 6: the same dodge with its cache in a folder of the code's
    (on ``sys.path``, so the new process may read it) and made by the ranks alone would
    pass if the process ran beside the ranks; it answers before them, so it waits for a
    batch no rank has written yet and is late ("not done", never correct)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    fn = _waiting(str(tmp_path / "cache"), False)
    got = check_mix_batch(fn, cluster=cluster)
    assert got.status == "not done" and "in a new Python process" in got.message, got.message


#: Rule 6's walls, probed from the new process (a cell's code, no ranks): each of a file in
#: the shared folder read, one written there and in the working folder, a socket made, and
#: this process's own status and the code's files read, as 1 (done) or 0 (refused).
_WALLS = _defined_in_a_cell(
    "import os, socket\n"
    f"SHARED = {_SHARED!r}\n"
    "def _tries():\n"
    "    yield lambda: open(os.path.join(SHARED, 'left')).read()\n"
    "    yield lambda: open(os.path.join(SHARED, 'new'), 'w').write('x')\n"
    "    yield lambda: open('ezpz_nb-t9-left-here', 'w').write('x')\n"
    "    yield lambda: socket.socket(socket.AF_UNIX).close()\n"
    "    yield lambda: open('/proc/self/status').read()\n"
    "    yield lambda: open(socket.__file__).read()\n"
    "def walls(sizes, weights, global_batch, step, dp_rank, dp_size, seed):\n"
    "    out = []\n"
    "    for k, f in enumerate(_tries()):\n"
    "        try:\n"
    "            f()\n"
    "            out.append((k, 1))\n"
    "        except OSError:\n"
    "            out.append((k, 0))\n"
    "    return out\n",
    "walls",
)


@pytest.mark.skipif(bool(not_confined()), reason="no Landlock here: rule 6 says not judged")
def test_the_new_process_reads_no_shared_place_and_writes_nothing(tmp_path, monkeypatch):
    """Guards rule 6's confinement on its own (no ranks): a file left in the machine's
    temporary folder cannot be read from the new process, nothing can be written there or
    in its working folder, no socket made; its own /proc entry and the code's files read."""
    os.makedirs(_SHARED, exist_ok=True)
    try:
        with open(os.path.join(_SHARED, "left"), "w") as f:
            f.write("the ranks' batch")
        monkeypatch.chdir(tmp_path)
        with _fresh_stream(_WALLS, 5) as stream:
            got = stream.batches()
        assert got == [[(0, 0), (1, 0), (2, 0), (3, 0), (4, 1), (5, 1)]] * 2
        assert sorted(os.listdir(_SHARED)) == ["left"] and not os.listdir(tmp_path)
    finally:
        shutil.rmtree(_SHARED, ignore_errors=True)


def test_the_new_process_starts_without_torch():
    """Guards issue 47's fifth round: the new process imports what it runs, not torch (the
    confinement's modules took it in: 1.5 s of CPU a check, for answers of plain Python or
    numpy); an answer that uses torch imports it as it is unpickled."""
    code = (
        "import sys, ezpz_nb.workshop.mix_fresh, ezpz_nb.workshop.confine, "
        "ezpz_nb.workshop.no_sockets, ezpz_nb.launcher.wire\n"
        "print([m for m in ('torch', 'numpy') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out


def test_where_landlock_is_missing_rule_6_is_not_judged():
    """Guards rule 6 where the new process cannot be confined (no Landlock: an older kernel,
    macOS): it could have read the ranks' stream, so a match is "not judged here", named
    with why, never said to be the same stream in a confined process. Run in a notebook of
    its own (a Python process, fresh ranks) whose Landlock is made to look missing before
    any check: the checker's guard refuses code changed after its first check."""
    script = (
        "import json, sys\n"
        "from ezpz_nb.workshop import confine\n"
        "confine.landlock_abi = lambda: 0\n"
        "from ezpz_nb.workshop.mix_confine import not_confined\n"
        "from ezpz_nb.workshop.mixture import check_mix_batch\n"
        "ns = {'__name__': '__main__'}\n"
        f"exec({_SEEDED_BY_SHA256!r}, ns)\n"
        "got = check_mix_batch(ns['mix_batch'], timeout=60)\n"
        "print(json.dumps([not_confined(), got.status, ' '.join(got.message.split())]))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600, check=True
    )
    missing, status, said = json.loads(run.stdout.strip().splitlines()[-1])
    assert missing[0].startswith("files it reads and writes ("), missing
    assert status == "correct", said
    assert "not judged here" in said and "Landlock is off" in said and "confined" not in said
