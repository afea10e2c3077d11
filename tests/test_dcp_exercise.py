"""Notebook 15's exercise checker on real ranks: right answers, dodges, a learner's typo.

Each check draws its layouts' order, the dataset's size, two loader seeds, the two save
steps and the seeds and sizes of the twins it saves at each place, so every answer here is
judged over several draws: the saves on one warm cluster, confined to their checkpoints, the
loads on ranks of the checker's own (shared by the module's checks: nothing of a save reaches
them but its checkpoint), from checkpoints rebuilt from what DCP holds. The dodges that need
the learner's own path (no cluster: saves and loads on sealed ranks of the check's own, every
thread confined) run it: code a save leaves for the rank's other threads. A process started
before the check that copies what a save leaves beside its checkpoint (issue 45's seventh
trial) finds no folder, or is named from the kernel's record of what was written.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator

import pytest
import torch.distributed as dist

import ezpz_nb as ez
from ezpz_nb.workshop import confine
from ezpz_nb.workshop.dcp_state import CORPUS, check_loader_state, shared_load_ranks

pytestmark = pytest.mark.timeout(400)

#: Checks per answer: each draws its own steps, sizes and layout order. One in `make unit`
#: (each run draws afresh), 20 in `make stress`.
DRAWS = int(os.environ.get("EZPZ_NB_DRAWS", "1"))


@pytest.fixture(scope="module")
def cluster() -> Iterator[ez.Cluster]:
    """Four warm ranks for the whole corpus's saves; the loads share four ranks of the
    checker's own (their imports of DCP paid once for the module, not once a check)."""
    with ez.Cluster(world_size=4, timeout=120) as c, shared_load_ranks():
        yield c


@pytest.mark.parametrize("name", list(CORPUS))
def test_the_checker_judges_its_corpus(cluster, name):
    """Each entry: right answers (one unusual: keyed by global rank, RNG as a list) pass,
    and the three dodges fail with their own diagnosis.

    Guards: a false pass of a dodge that loses data in real jobs (one key for every
    rank, only rank 0 saving, the RNG forgotten), and a false failure of a right
    answer written differently.
    """
    save, load, expected = CORPUS[name]
    said = {
        "one key for every rank": "DCP kept one copy",
        "only rank 0 saves": "started its shard over",
        "RNG forgotten": "RNG",
    }
    for _ in range(DRAWS):
        result = check_loader_state(save, load, cluster=cluster)
        assert result.status == expected, result.message
        if name in said:
            assert said[name] in result.message


# ---------------------------------------------------------------- dodges of issue 45
_SKIP: dict[str, int] = {}


def skip_fixed_steps(loader, layout):
    """Dodge: saves nothing; the load skips a fixed number of steps (the old STOP, 3)."""
    return {}


def load_skip_fixed_steps(loader, layout, state):
    it = iter(loader)
    for _ in range(3):
        next(it)


def by_rank_halved(loader, layout):
    """Dodge: the DP rank hard-coded as rank // 2 (right at dp 2 x tp 2 only)."""
    return {f"dp_rank_{dist.get_rank() // 2}": loader.state_dict()}


def load_by_rank_halved(loader, layout, state):
    loader.load_state_dict(state[f"dp_rank_{dist.get_rank() // 2}"])


# One prefix for the test and its ranks (a rank imports this module anew: a pid here would be
# the rank's, and the cleanup below would miss its files). Another run's files under it only
# make a dodge's restore more wrong.
_SIDE = os.path.join(tempfile.gettempdir(), "ezpz-nb15-side")


def side_file(loader, layout):
    """Dodge: the state kept in a file beside the checkpoint, a dummy inside it."""
    s = loader.state_dict()
    keep = {"shard": s["shard"], "offset": s["offset"], "generator": s["generator"].tolist()}
    with open(f"{_SIDE}-{dist.get_rank()}.json", "w") as f:
        json.dump(keep, f)
    return {f"dp_rank_{layout.dp_rank}": {"dummy": 0}}


def load_side_file(loader, layout, state):
    import torch

    with open(f"{_SIDE}-{dist.get_rank()}.json") as f:
        s = json.load(f)
    s["generator"] = torch.tensor(s["generator"], dtype=torch.uint8)
    loader.load_state_dict(s)


def in_memory(loader, layout):
    """Dodge: the state kept in the rank's memory (a module global), a dummy in the checkpoint."""
    import builtins

    builtins._ezpz_nb15_stash = loader.state_dict()
    return {f"dp_rank_{layout.dp_rank}": {"dummy": 0}}


def load_in_memory(loader, layout, state):
    import builtins

    loader.load_state_dict(builtins._ezpz_nb15_stash)


def offset_only_then_replay(loader, layout):
    """Dodge: the offset saved, the RNG replayed by reading the batches again (wrong masks
    would be right only if masking did not depend on the generator's state)."""
    return {f"dp_rank_{layout.dp_rank}": {"offset": loader.state_dict()["offset"]}}


def load_offset_only(loader, layout, state):
    s = loader.state_dict()
    s["offset"] = int(state[f"dp_rank_{layout.dp_rank}"]["offset"])
    loader.load_state_dict(s)


def _in_frames(test):
    """Every value in the caller frames' locals for which ``test`` holds (what a dodge digs out)."""
    import inspect

    return [v for f in inspect.stack() for v in f.frame.f_locals.values() if test(v)]


def frames_nothing_saved(loader, layout):
    """Dodge (issue 45, trial 8): saves nothing; the load finds the save step in the
    checker's frames (a drawn case's steps) and skips to it."""
    return {}


def load_frames_nothing_saved(loader, layout, state):
    stops = _in_frames(lambda v: hasattr(v, "stops"))
    it = iter(loader)
    for _ in range(stops[0].stops[0] if stops else 3):
        next(it)


def patches_the_load_job(loader, layout):
    """Dodge (issue 45, trial 9): the save rebinds the checker's rank-side load job (and its
    batch reader) in the warm rank, to fakes that return the straight run from the step."""
    import sys

    mod = sys.modules["ezpz_nb.workshop.dcp_state"]
    import inspect

    plan = next(
        (f.frame.f_locals["plan"] for f in inspect.stack() if "plan" in f.frame.f_locals), None
    )
    if plan is None:  # dcp.load asks for the template too: no plan there
        return {}
    stops = [states[0]["offset"] // 2 for states, _ in plan]  # each place's step, from its states

    def fake_load(items, save, load):
        out = []
        for tp, n, seed, _ in items:
            lay = mod.make_layout(tp_size=tp)
            out.append(mod.seen(mod.stream(lay.dp_rank, lay.dp_size, n, seed))[stops[0] :])
        return out

    mod._load_part = fake_load
    return {}


def load_patched(loader, layout, state):
    pass


_STEPS: dict = {}


def side_by_step(loader, layout):
    """Dodge (issue 45, trial 10): one key with the step only; the state in the warm rank's
    memory and in a file, keyed by (rank, step)."""
    import torch

    key = (dist.get_rank(), loader.offset)
    _STEPS[key] = loader.state_dict()
    torch.save(_STEPS[key], f"{_SIDE}-{key[0]}-{key[1]}.pt")
    return {"offset": torch.tensor(loader.offset)}


def load_side_by_step(loader, layout, state):
    import torch

    key = (dist.get_rank(), int(state["offset"]))
    s = _STEPS.get(key) or torch.load(f"{_SIDE}-{key[0]}-{key[1]}.pt")
    loader.load_state_dict(s)


def side_by_path(loader, layout):
    """Dodge: the state in a file named after the checkpoint's path (found in dcp.save's
    frame), nothing in the checkpoint."""
    import torch

    path = _in_frames(lambda v: isinstance(v, str) and "ezpz-nb15-" in v)[0]
    torch.save(loader.state_dict(), f"{path}.{dist.get_rank()}.side")
    return {}


def load_side_by_path(loader, layout, state):
    import torch

    path = _in_frames(lambda v: isinstance(v, str) and "ezpz-nb15-" in v)[0]
    loader.load_state_dict(torch.load(f"{path}.{dist.get_rank()}.side"))


def side_by_token(loader, layout):
    """Dodge (issue 45, found by the fixers): the checkpoint holds a random token that names
    a side file holding the state."""
    import uuid

    import torch

    token = uuid.uuid4().hex
    torch.save(loader.state_dict(), f"{_SIDE}-token-{token}.pt")
    return {f"dp_rank_{layout.dp_rank}": {"token": token}}


def load_side_by_token(loader, layout, state):
    import torch

    token = state[f"dp_rank_{layout.dp_rank}"]["token"]
    loader.load_state_dict(torch.load(f"{_SIDE}-token-{token}.pt"))


def _named(loader, rank):
    import hashlib

    key = f"{loader.seed}-{loader.offset}-{len(loader.dataset)}-{rank}"
    return f"{_SIDE}-named-{hashlib.sha256(key.encode()).hexdigest()[:16]}.pt"


def side_by_name(loader, layout):
    """Dodge (issue 45): the checkpoint holds the offset only; the state goes to a side file
    whose name is a hash of the loader's seed, its place, its dataset's size and the rank."""
    import torch

    torch.save(loader.state_dict(), _named(loader, dist.get_rank()))
    return {f"dp_rank_{layout.dp_rank}": {"offset": torch.tensor(loader.offset)}}


def load_side_by_name(loader, layout, state):
    import torch

    loader.offset = int(state[f"dp_rank_{layout.dp_rank}"]["offset"])
    loader.load_state_dict(torch.load(_named(loader, dist.get_rank())))


def side_in_checkpoint_folder(loader, layout):
    """Dodge (issue 45, trial 3): the state torch.save'd into the checkpoint's own folder
    (its path read from the checker's frame), a dummy in what DCP writes."""
    import torch

    path = _in_frames(lambda v: isinstance(v, str) and v.endswith("/checkpoint"))[0]
    os.makedirs(path, exist_ok=True)
    torch.save(loader.state_dict(), os.path.join(path, f"side{dist.get_rank()}.pt"))
    return {"v": torch.zeros(1)}


def load_side_in_checkpoint_folder(loader, layout, state):
    import torch

    path = _in_frames(lambda v: isinstance(v, str) and v.endswith("/checkpoint"))[0]
    loader.load_state_dict(torch.load(os.path.join(path, f"side{dist.get_rank()}.pt")))


def place_object(loader, layout):
    """Right (unusual): per DP rank an object holding the place as tensors (DCP pickles it)."""
    from types import SimpleNamespace

    import torch

    s = loader.state_dict()
    return {
        f"dp_rank_{layout.dp_rank}": SimpleNamespace(
            shard=torch.tensor(s["shard"]), offset=torch.tensor(s["offset"]), rng=s["generator"]
        )
    }


def load_place_object(loader, layout, state):
    s = state[f"dp_rank_{layout.dp_rank}"]
    loader.load_state_dict({"shard": s.shard, "offset": s.offset, "generator": s.rng})


def replay_from_offset(loader, layout):
    """Right (unusual): one key for every rank holding only the offset (every DP rank is at
    the same one); the load replays a fresh loader to it, masks included."""
    import torch

    return {"offset": torch.tensor(loader.offset)}


def load_replay_from_offset(loader, layout, state):
    it = iter(loader)
    for _ in range(int(state["offset"]) // loader.batch_size):
        next(it)


def numpy_rng_keyed_by_replica(loader, layout):
    """Right (unusual): keyed by replica and DP size, the RNG as a numpy array, a 0-d offset."""
    import torch

    s = loader.state_dict()
    return {
        f"replica{layout.dp_rank}of{layout.dp_size}": {
            "shard": s["shard"],
            "offset": torch.tensor(s["offset"]),
            "rng": s["generator"].numpy().copy(),
        }
    }


def load_numpy_rng_keyed_by_replica(loader, layout, state):
    import numpy as np
    import torch

    s = state[f"replica{layout.dp_rank}of{layout.dp_size}"]
    rng = torch.from_numpy(np.asarray(s["rng"]))
    loader.load_state_dict({"shard": s["shard"], "offset": int(s["offset"]), "generator": rng})


def typo_on_tp_peers(loader, layout):
    """A learner's typo on the TP peers' path only (rank 0 never reaches it)."""
    if layout.tp_rank:
        return {f"dp_rank_{layout.dp_rank}": loader.state_dcit()}
    return {f"dp_rank_{layout.dp_rank}": loader.state_dict()}


def load_keyed(loader, layout, state):
    loader.load_state_dict(state[f"dp_rank_{layout.dp_rank}"])


@pytest.mark.parametrize(
    "save,load",
    [
        (skip_fixed_steps, load_skip_fixed_steps),
        (by_rank_halved, load_by_rank_halved),
        (side_file, load_side_file),
        (in_memory, load_in_memory),
        (offset_only_then_replay, load_offset_only),
        (frames_nothing_saved, load_frames_nothing_saved),
        (patches_the_load_job, load_patched),
        (side_by_step, load_side_by_step),
        (side_by_path, load_side_by_path),
        (side_by_token, load_side_by_token),
        (side_by_name, load_side_by_name),
        (side_in_checkpoint_folder, load_side_in_checkpoint_folder),
    ],
    ids=[
        "skip_fixed_steps", "rank_halved", "side_file", "in_memory", "offset_only",
        "frames", "patch_load_job", "side_by_step", "side_by_path", "side_by_token",
        "side_by_name", "side_in_checkpoint_folder",
    ],
)  # fmt: skip
def test_dodges_of_every_class_are_rejected(cluster, save, load):
    """Guards issue 45's dodges of 15: a fixed step skipped instead of a state loaded,
    the DP rank hard-coded as ``rank // 2``, the state kept outside the checkpoint (a file,
    the rank's memory, keyed by rank, by step or by the checkpoint's path; a file named by
    a random token the checkpoint holds, or by a hash of the loader's seed and place; a file
    in the checkpoint's own folder), a state without the RNG, the save step read from the
    checker's frames, the checker's load job rebound by the save on the warm ranks; each
    over several draws (steps, sizes, seeds, layout order)."""
    try:
        for _ in range(DRAWS):
            result = check_loader_state(save, load, cluster=cluster)
            assert result.status == "wrong", result.message
    finally:
        for path in glob.glob(f"{_SIDE}-*") + glob.glob(
            f"{tempfile.gettempdir()}/ezpz-nb15-*.side"
        ):
            with contextlib.suppress(FileNotFoundError):  # another run's cleanup took it
                os.remove(path)


# ---------------------------------------------------------------- outside the checkpoint
# Issue 45's fourth trial: the checkpoint holds a digest of the place, the place itself is
# kept elsewhere. Each place below is one a learner's process can write to or start.
_DIGEST_DIR = os.path.join(tempfile.gettempdir(), "ezpz-nb15-digests")
_HERE = os.path.dirname(os.path.abspath(__file__))


def _digest(s):
    import hashlib

    raw = repr((int(s["shard"]), int(s["offset"]))).encode() + bytes(s["generator"].tolist())
    return hashlib.sha256(raw).hexdigest()[:15]


def _digest_saver(keep):
    """A dodge's loader_state: ``keep(digest, state)`` stores the place, the checkpoint
    holds the digest only (the same for two loaders at one place: the twins agree)."""

    def save(loader, layout):
        import torch

        s = loader.state_dict()
        h = _digest(s)
        keep(h, s)
        return {f"dp{layout.dp_rank}": torch.tensor([int(h, 16)])}

    return save


def _digest_loader(fetch):
    def load(loader, layout, state):
        h = format(int(state[f"dp{layout.dp_rank}"].item()), "x").zfill(15)
        loader.load_state_dict(fetch(h))

    return load


def _in_folder(folder):
    def keep(h, s):
        import torch

        os.makedirs(folder, exist_ok=True)
        torch.save(s, os.path.join(folder, f"{h}.pt"))

    def fetch(h):
        import torch

        return torch.load(os.path.join(folder, f"{h}.pt"))

    return _digest_saver(keep), _digest_loader(fetch)


def _in_a_child(daemon):
    """The place held by a child process the save forks (``daemon``: it forks again and
    leaves a new session, as a daemon does), served on an abstract unix socket."""

    def keep(h, s):
        import pickle
        import socket

        if os.fork() == 0:  # the child serves; the rank goes on
            try:
                if daemon:
                    os.setsid()
                    if os.fork():
                        os._exit(0)
                srv = socket.socket(socket.AF_UNIX)
                srv.bind(f"\0ezpz-nb15-{h}")
                srv.listen()
                while True:
                    conn, _ = srv.accept()
                    conn.sendall(pickle.dumps(s))
                    conn.close()
            finally:
                os._exit(0)

    def fetch(h):
        import pickle
        import socket

        c = socket.socket(socket.AF_UNIX)
        c.connect(f"\0ezpz-nb15-{h}")
        return pickle.loads(c.makefile("rb").read())

    return _digest_saver(keep), _digest_loader(fetch)


def _in_a_program_env():
    """The place in the environment of a program the save starts (read from /proc)."""

    def keep(h, s):
        import subprocess
        import sys

        env = {"EZPZ_NB15": json.dumps({**s, "generator": s["generator"].tolist()}), "H": h}
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)

    def fetch(h):
        raise LookupError(f"the program holding {h} was never started")

    return _digest_saver(keep), _digest_loader(fetch)


def _on_tcp():
    """The place served over TCP by a thread the save starts in the rank."""

    def keep(h, s):
        import socket

        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))

    return _digest_saver(keep), _digest_loader(lambda h: {})


def _in_sysv_shm():
    """The place in System V shared memory under a key from the digest (no file, no socket)."""
    import ctypes

    def seg(h, size, flags):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.shmat.restype = ctypes.c_void_p
        ident = libc.shmget(ctypes.c_int(int(h[:7], 16)), ctypes.c_size_t(size), flags)
        if ident == -1:  # as a library over it would (sysv_ipc): the error, not a bad address
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        return libc.shmat(ident, None, 0)

    def keep(h, s):
        raw = json.dumps({**s, "generator": s["generator"].tolist()}).encode()
        ctypes.memmove(seg(h, 1 << 16, 0o1600), raw + b"\0", len(raw) + 1)

    def fetch(h):
        import torch

        got = json.loads(ctypes.string_at(seg(h, 1 << 16, 0o600)).decode())
        return {**got, "generator": torch.tensor(got["generator"], dtype=torch.uint8)}

    return _digest_saver(keep), _digest_loader(fetch)


_OUTSIDE = {
    "tmp_folder": _in_folder(_DIGEST_DIR),
    "dev_shm": _in_folder("/dev/shm/ezpz-nb15-digests"),
    "notebook_folder": _in_folder(os.path.join(_HERE, ".ezpz-nb15-digests")),
    "child_process": _in_a_child(daemon=False),
    "daemon": _in_a_child(daemon=True),
    "program_env": _in_a_program_env(),
    "tcp_server": _on_tcp(),
    "sysv_shm": _in_sysv_shm(),
}


@pytest.mark.skipif(not confine.landlock_abi(), reason="needs Linux with Landlock")
@pytest.mark.parametrize("where", list(_OUTSIDE))
def test_a_state_kept_outside_the_checkpoint_is_refused(cluster, where):
    """Guards issue 45's fourth trial's "checkpoint holds a digest only, the state in a side
    folder" and its variants: a fixed folder in /tmp, /dev/shm, the notebook's folder, a child
    process (or a daemon that forked again) serving it on a socket, a program's environment,
    a TCP server, System V shared memory. Each is refused or found, named, and ended; nothing
    of it is left behind; the saves' ranks still write files after."""
    save, load = _OUTSIDE[where]
    try:
        result = check_loader_state(save, load, cluster=cluster)
        assert result.status == "wrong", result.message
        assert "the state must be in the checkpoint" in result.message.lower(), result.message
    finally:
        folders = (_DIGEST_DIR, "/dev/shm/ezpz-nb15-digests", f"{_HERE}/.ezpz-nb15-digests")
        written = [f for f in folders if os.path.exists(f)]
        for folder in written:
            shutil.rmtree(folder, ignore_errors=True)
    assert not written, f"{written} written"
    # Nothing below the warm ranks, and they write as before (only the saves' thread was held).
    pids = cluster.run(os.getpid)
    assert confine.processes_below(pids) == {}
    assert cluster.run(lambda: tempfile.TemporaryFile().close() or "wrote") == ["wrote"] * 4


def _start_writer():
    """In a warm rank, before the check: a thread of the learner's that writes whatever a save
    leaves in ``builtins`` to a file (it runs outside the saves' confinement)."""
    import builtins
    import threading
    import time

    def run():
        while not getattr(builtins, "_ezpz_nb15_stop", False):
            for h, s in dict(getattr(builtins, "_ezpz_nb15_out", {})).items():
                import torch

                os.makedirs(_DIGEST_DIR, exist_ok=True)
                torch.save(s, os.path.join(_DIGEST_DIR, f"{h}.pt"))
            time.sleep(0.005)

    builtins._ezpz_nb15_stop = False
    threading.Thread(target=run, name="learners-writer", daemon=True).start()


def _stop_writer():
    import builtins
    import threading

    builtins._ezpz_nb15_stop = True
    for t in threading.enumerate():
        if t.name == "learners-writer":
            t.join()


def _to_writer(h, s):
    import builtins

    builtins.__dict__.setdefault("_ezpz_nb15_out", {})[h] = s


@pytest.mark.system  # a check of its own (saves and loads on sealed ranks): ~8 s
@pytest.mark.skipif(not confine.landlock_abi(), reason="needs Linux with Landlock")
def test_a_thread_started_before_the_check_never_sees_the_saves(cluster):
    """Guards the one way around the saves' confinement on a warm cluster: a thread the
    learner started there earlier, unconfined, writing what a save leaves in memory. The
    checker sees the thread and saves on ranks of its own; the thread writes nothing."""
    cluster.run(_start_writer)
    try:
        save, load = _digest_saver(_to_writer), _in_folder(_DIGEST_DIR)[1]
        result = check_loader_state(save, load, cluster=cluster)
        assert result.status == "wrong", result.message
    finally:
        cluster.run(_stop_writer)
        wrote = os.path.exists(_DIGEST_DIR)
        shutil.rmtree(_DIGEST_DIR, ignore_errors=True)
    assert not wrote, "the learner's thread wrote a save's state"


# Issue 45's fifth trial: the save confined in a thread, the learner's code rebinds what the
# rank's other threads run after it, unconfined, and they write the place to a side folder.
def _written_later(h, s):
    """Keep the place for the rank's other threads to write (see :func:`_write_pending`)."""
    import builtins

    builtins.__dict__.setdefault("_ezpz_nb15_pending", {})[h] = s


def _write_pending():
    """Write every place kept so far; note which were written, or that a write was refused."""
    import builtins

    import torch

    pending = dict(getattr(builtins, "_ezpz_nb15_pending", {}))
    try:
        os.makedirs(_DIGEST_DIR, exist_ok=True)
        for h, s in pending.items():
            torch.save(s, os.path.join(_DIGEST_DIR, f"{h}.pt"))
    except OSError:
        builtins._ezpz_nb15_refused = True
        raise
    builtins._ezpz_nb15_wrote = set(pending)


def _by_the_reply(h, s):
    """The rank's reply function rebound: its main thread writes the place after the save."""
    import sys

    _written_later(h, s)
    rank = sys.modules["ezpz_nb.launcher.rank"]
    if not hasattr(rank, "_ezpz_nb15_dumps"):
        rank._ezpz_nb15_dumps = rank.dumps

        def dumps(msg, *args, **kwargs):
            _write_pending()
            return rank._ezpz_nb15_dumps(msg, *args, **kwargs)

        rank.dumps = dumps


def _by_the_lifeline(h, s):
    """``os.getppid`` rebound: the rank's lifeline watcher, which calls it every half second,
    writes the place; the save waits for that write (or for its refusal)."""
    import builtins
    import time

    _written_later(h, s)
    if not hasattr(os, "_ezpz_nb15_getppid"):
        os._ezpz_nb15_getppid = os.getppid

        def getppid():
            try:
                _write_pending()
            except Exception:  # noqa: BLE001 - the watcher must go on (the rank would exit)
                pass
            return os._ezpz_nb15_getppid()

        os.getppid = getppid
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and not getattr(builtins, "_ezpz_nb15_refused", False):
        if h in getattr(builtins, "_ezpz_nb15_wrote", ()):
            break
        time.sleep(0.01)


def _by_a_gloo_callback(h, s):
    """A callback on an asynchronous collective: gloo's worker thread runs it and writes the
    place (a large tensor, so the callback is in before the collective ends)."""
    import torch

    _written_later(h, s)
    work = dist.all_reduce(torch.zeros(1 << 20), async_op=True)
    work.get_future().then(lambda _: _write_pending())


_LATER = {
    "reply": _by_the_reply,
    "lifeline": _by_the_lifeline,
    "gloo_callback": _by_a_gloo_callback,
}


@pytest.mark.skipif(not confine.landlock_abi(), reason="needs Linux with Landlock")
@pytest.mark.parametrize(
    "thread",
    # The reply (the fifth trial's case) in `make unit`; the other threads, sealed by the
    # same call, under `make system` (a check of its own: ~5 s each).
    ["reply", *(pytest.param(t, marks=pytest.mark.system) for t in _LATER if t != "reply")],
)
def test_code_a_save_leaves_for_the_ranks_other_threads_writes_nothing(cluster, thread):
    """Guards issue 45's fifth trial's dodge of 15 (its class, one case per thread a rank
    runs): the save rebinds the function the rank's main thread replies with, or a function
    the lifeline watcher calls, or hands a gloo worker a callback, and that thread, outside
    a confined save thread, writes the place to a side folder the loads read. The check's
    own path (no cluster) seals every thread of its save ranks first: nothing is written."""
    save, load = _digest_saver(_LATER[thread]), _in_folder(_DIGEST_DIR)[1]
    try:
        result = check_loader_state(save, load)
        assert result.status == "wrong", result.message
    finally:
        wrote = os.path.exists(_DIGEST_DIR)
        shutil.rmtree(_DIGEST_DIR, ignore_errors=True)
    assert not wrote, "a thread of the save ranks wrote the place outside the checkpoint"
    if thread == "reply":
        assert "could not reply" in result.message, result.message
        assert "the state must be in the checkpoint" in result.message.lower(), result.message


# Issue 45's seventh trial: the save writes the place beside its checkpoint (where it may
# write), a process the notebook started in an earlier cell copies it out before the checker
# removes the folder, the checkpoint holds a digest, the load reads the copy.
_COPIES = os.path.join(tempfile.gettempdir(), "ezpz-nb15-copies")
_COPIER = r"""
import glob, os, shutil, stat, sys, tempfile, time
out, force, remove = sys.argv[1], sys.argv[2] == "force", sys.argv[2] != "list"
seen = {}
while os.path.isdir(out):
    for root in glob.glob(os.path.join(tempfile.gettempdir(), "ezpz-nb15-*")):
        try:
            mode = stat.S_IMODE(os.stat(root).st_mode)
            if force and not mode & 0o400:  # make the parent listable for a moment
                os.chmod(root, 0o700)
            for p in glob.glob(os.path.join(root, "*", "*.side")):
                size = os.path.getsize(p)  # copied once its size holds still
                dst = os.path.join(out, os.path.basename(p))
                if size and seen.get(p) == size:
                    if not os.path.exists(dst):  # two twins at a place: one name
                        shutil.copyfile(p, dst + ".part")
                        os.replace(dst + ".part", dst)
                    if remove:  # and leave nothing for the checker to find
                        os.remove(p)
                seen[p] = size
            if force and not mode & 0o400:
                os.chmod(root, mode)
        except OSError:
            pass
    time.sleep(0.002)
"""


def _beside(loader, layout, wait=0.0):
    """Dodge: the place torch.save'd beside the checkpoint (its path read from DCP's frame);
    ``wait``: the save returns once the file is gone (taken by the copier), up to that long."""
    import sys
    import time

    import torch

    s = loader.state_dict()
    h = _digest(s)
    f = sys._getframe(1)
    while f is not None and "checkpoint_id" not in f.f_locals:
        f = f.f_back
    if f is not None:
        where = os.path.dirname(os.fspath(f.f_locals["checkpoint_id"]))
        try:
            torch.save(s, os.path.join(where, f"{h}.side"))
        except (OSError, RuntimeError):  # the load's template call: it may write nothing
            pass
        until = time.monotonic() + wait
        while os.path.exists(os.path.join(where, f"{h}.side")) and time.monotonic() < until:
            time.sleep(0.005)
    return {f"dp{layout.dp_rank}": torch.tensor([int(h, 16)])}


def _beside_until_taken(loader, layout):
    # As root the copier lists any folder and takes the file at once; as another user it
    # finds none, and one wait is enough to know: no more after a wait that timed out.
    global _GAVE_UP
    import time

    start = time.monotonic()
    out = _beside(loader, layout, wait=0.0 if _GAVE_UP else 2.0)
    _GAVE_UP = _GAVE_UP or time.monotonic() - start > 2.0
    return out


_GAVE_UP = False


def _from_the_copies(h):
    import torch

    return torch.load(os.path.join(_COPIES, f"{h}.side"))


# "list" under `make system` ("remove" finds what it finds, and more); the others in unit.
@pytest.mark.parametrize("how", [pytest.param("list", marks=pytest.mark.system), "remove", "force"])
def test_a_process_outside_the_check_finds_no_checkpoint(cluster, how, monkeypatch, short_tmp):
    """Guards issue 45's seventh trial: a process started before the check (outside every
    rank it confines) that copies what a save leaves beside its checkpoint, by listing the
    folders (``list``: a user other than root finds none; the file left beside is named), and
    removing what it copied (``remove``: as root, which lists any folder, the kernel's record
    of what was written names it), or making the parent listable first (``force``: seen).
    The check's folders and the copier's search are in a private temporary folder: the
    copier must not reach (and ``force`` must not chmod) another 15 check's folders on this
    machine (the eighth trial's checks beside it were told "listed by a process outside")."""
    import subprocess
    import sys

    monkeypatch.setattr(tempfile, "tempdir", short_tmp)  # where the check makes its folders
    os.makedirs(_COPIES, exist_ok=True)
    copier = subprocess.Popen(
        [sys.executable, "-c", _COPIER, _COPIES, how], env={**os.environ, "TMPDIR": short_tmp}
    )
    try:
        save = _beside if how == "list" else _beside_until_taken
        result = check_loader_state(save, _digest_loader(_from_the_copies), cluster=cluster)
    finally:
        copied = os.listdir(_COPIES)
        shutil.rmtree(_COPIES, ignore_errors=True)
        copier.wait(timeout=30)
    assert result.status == "wrong", result.message
    said = "listed or changed by a process" if how == "force" else "beside DCP's own files"
    assert said in result.message, result.message
    assert how == "force" or os.geteuid() == 0 or not copied, copied


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # one process, on purpose
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")
def test_the_kernels_record_names_a_file_written_beside_and_removed():
    """Guards what a user who may list any folder (root) could do past the folders' mode: a
    file made beside DCP's own and removed before the checker looks is named from the
    kernel's record; a plain DCP save (one process) is not."""
    import torch
    import torch.distributed.checkpoint as dcp

    from ezpz_nb.workshop.dcp_guard import Folders
    from ezpz_nb.workshop.dcp_watch import Watch
    from ezpz_nb.workshop.stops import CheckStopped

    folders = Folders()
    try:
        plain, beside = folders.make(), folders.make()
        watch = Watch([plain, beside])
        dcp.save({"data": {"offset": torch.tensor([3])}}, checkpoint_id=plain)
        watch.judge()  # DCP's own writes only
        watch = Watch([plain, beside])
        dcp.save({"data": {"offset": torch.tensor([3])}}, checkpoint_id=beside)
        side = os.path.join(os.path.dirname(beside), "state.side")
        with open(side, "wb") as f:
            f.write(b"the place")
        os.remove(side)
        with pytest.raises(CheckStopped, match="state.side was written"):
            watch.judge()
        folders.check()  # the checker's own folders changed nothing it watches
    finally:
        folders.close()
    assert not os.path.exists(folders.root)


def test_rules_that_cannot_run_are_named():
    """Guards a silent pass where Landlock is missing: each rule that did not run is named."""
    assert confine.confinement(7) == []
    assert "writes outside the checkpoint" in confine.confinement(0)[0]
    assert [m.split(" (")[0] for m in confine.confinement(3)] == [
        "TCP sockets",
        "abstract unix sockets",
    ]


@pytest.mark.parametrize(
    "save,load",
    [
        (replay_from_offset, load_replay_from_offset),
        (numpy_rng_keyed_by_replica, load_numpy_rng_keyed_by_replica),
        (place_object, load_place_object),
    ],
    ids=["replay_from_offset", "numpy_rng_by_replica", "place_object"],
)
def test_unusual_right_answers_pass(cluster, save, load):
    """Guards a false failure of right answers the trials wrote: one key with the offset and a
    replay, per-replica keys with the RNG as numpy, and an object holding the place as
    tensors (DCP pickles it); over several draws, each through the checker's twins."""
    for _ in range(DRAWS):
        result = check_loader_state(save, load, cluster=cluster)
        assert result.status == "correct", result.message


def keyed_by_rank_mod_dp(loader, layout):
    """Wrong (issue 45's fourth trial): the global rank % dp taken for the DP rank."""
    return {f"dp{dist.get_rank() % layout.dp_size}": loader.state_dict()}


def load_keyed_by_rank_mod_dp(loader, layout, state):
    loader.load_state_dict(state[f"dp{dist.get_rank() % layout.dp_size}"])


def load_one_batch_back(loader, layout, state):
    """Wrong (issue 45's fourth trial): "the step was saved after it ran", one batch back."""
    s = dict(state[f"dp_rank_{layout.dp_rank}"])
    s["offset"] = int(s["offset"]) - loader.batch_size  # drawn per layout
    loader.load_state_dict(s)


@pytest.mark.parametrize(
    "save,load,words",
    [
        (keyed_by_rank_mod_dp, load_keyed_by_rank_mod_dp, "layout.dp_rank (rank // tp"),
        (CORPUS["keyed by DP rank"][0], load_one_batch_back, "one batch before the saved place"),
    ],
    ids=["rank_mod_dp", "one_batch_back"],
)
def test_honest_mistakes_are_named(cluster, save, load, words):
    """Guards the verdict's words for issue 45's fourth trial's honest mistakes: the DP rank
    taken as the global rank % dp (named: layout.dp_rank, TP innermost), and the offset moved
    one batch back on load (named as such, not as state kept outside the checkpoint)."""
    result = check_loader_state(save, load, cluster=cluster)
    assert result.status == "wrong" and words in result.message, result.message


def test_a_typo_shows_the_raising_rank_its_exception_and_the_learners_line(cluster, capsys):
    """Guards issue 45's "15's checker hides the learner's error": a typo only on the TP
    peers' path named by the rank that raised, with the exception type, its message and
    the learner's line, never a list of frames or an empty one. Printed once."""
    result = check_loader_state(typo_on_tp_peers, load_keyed, cluster=cluster)
    assert result.status == "wrong", result.message
    msg = result.message
    assert "AttributeError" in msg and "state_dcit" in msg, msg
    assert "loader.state_dcit()" in msg and "test_dcp_exercise.py:" in msg, msg
    assert "Frame(" not in msg and "[]" not in msg, msg
    assert any(f"rank {r} raised" in msg for r in (1, 3)), msg
    assert capsys.readouterr().out.count("loader_state: not right yet") == 1


def test_not_done_before_any_rank_starts():
    """Guards: an unfinished exercise reported as wrong (or started on ranks)."""
    assert check_loader_state(None, None).status == "not done"
    assert "must be functions" in check_loader_state({}, print).message  # type: ignore[arg-type]
