"""Send one batch from the TP leader to its peers: one collective per batch.

The wire format (``mode="tensor"``), chosen because on gloo each collective
costs about 0.3-0.5 ms however small it is (see docs/ezpz_pitfalls.md):

* Every step the leader broadcasts one ``uint8`` buffer: a 32-byte header
  (four int64 words) followed by the batch's tensors, each packed at an
  offset aligned to 8 bytes (16 for complex128) so that it can be viewed in
  place as its dtype. Peers size their receive buffer from the last spec
  they were sent, so they know the length without asking.
* Header word 0 says what this step is: ``DATA`` (payload follows in the same
  buffer), ``SPEC`` (the structure, shapes or dtypes changed: a second
  broadcast carries the pickled spec and the payload), ``END`` (the leader's
  loader is exhausted) or ``ERROR`` (the leader raised: a second broadcast
  carries what and where).
* With ``drop_last=True`` shapes never change, so after the first batch every
  step is exactly one broadcast. The leader leaves it running
  (``async_op=True``) and packs the next batch into a second buffer meanwhile;
  it waits for that broadcast before starting the next, so at most one is in
  flight, and for everything in flight before announcing the end or an error.
* At 8x512 tokens a broadcast takes ~0.4 ms, so each step's Python shows.
  The steady path keeps it small: both ends call the process group's own
  ``broadcast`` (not the ``dist.broadcast`` wrapper), the leader recognises a
  flat dict of tensors by keys, dtypes and shapes instead of re-pickling its
  spec, and peers read the header with ``struct``.
* Peers receive into one of two CPU buffers that take turns, each with its
  tensors already made as views into it. A buffer is reused only when nothing
  outside this object can reach the batch it last held: no Python reference to
  its tensors, no other tensor on its memory (a slice, a numpy array, autograd's
  saved input), no weak reference. Otherwise it is left to its holder and a new
  one is made, so a yielded batch stays valid as long as anything can see it.
  ``for batch in loader`` holds only the previous batch while the next arrives,
  so the other buffer is free and the steady step allocates nothing. (CUDA
  buffers under nccl are always new: the caching allocator makes that cheap and
  orders reuse with the streams, which a reference count cannot.)

``mode="pickle"`` is ezpz's path (``broadcast_object_list`` of the whole
batch, two collectives plus pickling), with the same announcements, kept so the
notebooks can compare the two.
"""

from __future__ import annotations

import contextlib
import pickle
import struct
import sys
import traceback
import weakref
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from ezpz_nb._dist import collective_device
from ezpz_nb.data.tree import flatten_batch, unflatten_batch

__all__ = ["BatchBroadcaster"]

DATA, SPEC, END, ERROR = 1, 2, 3, 4
_KIND_NAMES = {DATA: "data", SPEC: "data", END: "end", ERROR: "error"}
# Every slice must start at a multiple of its element size (view(dtype) needs
# it); the largest torch element is 16 bytes (complex128), so the header, the
# spec before a payload and each payload's length are padded to 16.
ALIGN = 16
HEADER_BYTES = 32  # four int64 words
_HEADER = struct.Struct("=4q")  # native order: the ranks share one machine's byte order


# Reference counts that say whether anything outside the broadcaster holds a
# received batch. Both are private torch APIs; without them a received buffer
# is simply never reused.
_STORAGE_USE_COUNT = getattr(torch._C, "_storage_Use_Count", None)
_CAN_RECYCLE = _STORAGE_USE_COUNT is not None and hasattr(torch.Tensor, "_use_count")


class _RecvBuffer(NamedTuple):
    """A peer's receive buffer with the batch's tensors already made as views into it."""

    buf: torch.Tensor
    header: Any  # numpy view of the header words (CPU), or None (CUDA: copied each step)
    tensors: list[torch.Tensor]
    idle: tuple[int, ...] | None  # _holders() while nothing outside holds it; None: never reuse


def _holders(buf: torch.Tensor, tensors: list[torch.Tensor]) -> tuple[int, ...]:
    """Everything that can reach a received batch, as counts.

    Per tensor: Python references (``sys.getrefcount``), C++ owners of the same
    tensor (autograd keeps saved inputs there) and weak references; then the
    references to the buffer's storage and its owners (every view, slice or
    numpy array made from any of the tensors adds one). Compared with the
    counts taken when the buffer was made, equal means nobody but this object
    can see the batch.
    """
    counts = [
        c
        for t in tensors
        for c in (sys.getrefcount(t), t._use_count(), weakref.getweakrefcount(t))  # type: ignore[attr-defined]
    ]
    # torch keeps one Python object per storage while anyone holds it, so its
    # reference counts show a caller holding untyped_storage().
    storage = buf.untyped_storage()
    counts += (
        sys.getrefcount(storage),
        weakref.getweakrefcount(storage),
        _STORAGE_USE_COUNT(storage._cdata),  # type: ignore[misc]
    )
    return tuple(counts)


def _finish(slot: list[Any] | None) -> None:
    """Wait for the broadcast still reading a leader's send ``slot``, if any."""
    if slot is not None and slot[2] is not None:
        work, slot[2] = slot[2], None
        work.wait()


def _align(n: int, to: int = 8) -> int:
    return (n + to - 1) // to * to


def _slots(layout: tuple[tuple[str, tuple[int, ...]], ...]) -> tuple[list[tuple[int, int]], int]:
    """Byte ``(offset, nbytes)`` of each tensor in the payload, and its total size."""
    slots, end = [], 0
    for dtype_name, shape in layout:
        itemsize = getattr(torch, dtype_name).itemsize
        # view(dtype) needs the offset to be a multiple of the element size.
        start = _align(end, max(8, itemsize))
        nbytes = itemsize * int(torch.Size(shape).numel())
        slots.append((start, nbytes))
        end = start + nbytes
    return slots, _align(end, ALIGN)


def _broadcast_options(async_op: bool) -> dist.BroadcastOptions:
    opts = dist.BroadcastOptions()
    opts.rootRank = 0  # group rank of the TP leader
    opts.rootTensor = 0
    if hasattr(opts, "asyncOp"):  # torch >= 2.6; tells NCCL which stream to use
        opts.asyncOp = async_op
    return opts


def _dumps_spec(spec: Any) -> bytes:
    """The batch's structure as bytes: plain pickle, or cloudpickle for a class pickle cannot name.

    A batch type defined in a notebook cell or inside the rank's function (a
    ``NamedTuple``, a dataclass) exists on the ranks only as a copy that plain
    pickle refuses to look up by name; cloudpickle sends it by value. Both are
    read back by ``pickle.loads``. The spec is pickled only when it changes.
    """
    try:
        return pickle.dumps(spec)
    except (pickle.PicklingError, AttributeError, TypeError):
        import cloudpickle

        return cloudpickle.dumps(spec)


def _to_bytes(t: torch.Tensor) -> bytes:
    return t.cpu().numpy().tobytes()


class BatchBroadcaster:
    """One end of the leader-to-peers channel of a TP group.

    The same object is used on every rank of the group: the leader (group rank
    0) calls :meth:`send`, :meth:`end` or :meth:`error` once per step, every
    other rank calls :meth:`recv` once per step.

    Args:
        group: The TP process group (``None`` means the default group).
        mode: ``"tensor"`` (packed buffer) or ``"pickle"`` (``broadcast_object_list``).
    """

    def __init__(self, group: Any = None, *, mode: str = "tensor") -> None:
        if mode not in ("tensor", "pickle"):
            raise ValueError(f"mode must be 'tensor' or 'pickle', got {mode!r}")
        self.group = group
        self.mode = mode
        self.src = dist.get_global_rank(group, 0) if group is not None else 0
        # The tensor path calls the process group's own broadcast: the
        # dist.broadcast wrapper re-derives the group, the root and the options
        # on every call, about 50 us per step here, a sixth of a small batch's
        # whole broadcast. Root 0 is the leader's rank *in the group*.
        self._pg: Any = group if group is not None else dist.group.WORLD
        self._opts = {flag: _broadcast_options(flag) for flag in (False, True)}
        # Tensors travel on the device the backend moves: nccl needs CUDA
        # buffers, gloo is used here with CPU ones.
        self.device = collective_device(group)
        self._spec: bytes | None = None  # leader: last spec sent
        # leader: (key, dtype, shape) per entry when the last spec was a flat dict of tensors
        self._dict_spec: list[tuple[Any, torch.dtype, torch.Size]] | None = None
        self._tree: Any = None  # peers: last spec received
        self._layout: tuple = ()
        self._slots: list[tuple[int, int]] = []  # byte (offset, nbytes) per tensor
        # peers: (dtype, shape, contiguous stride, byte offset, itemsize) per tensor
        self._views: list[tuple[torch.dtype, tuple[int, ...], tuple[int, ...], int, int]] = []
        self._payload_nbytes = 0  # both sides: payload size implied by the spec
        # leader, steady state: two [buffer, typed views, pending work] that take turns
        self._ring: list[list[Any] | None] = [None, None]
        self._turn = 0
        # peers, steady state: two receive buffers that take turns (see the module doc)
        self._recv_ring: list[_RecvBuffer | None] = [None, None]
        self._recv_turn = 0

    # ------------------------------------------------------------------ leader
    def send(self, batch: Any) -> None:
        """Broadcast ``batch`` to the group (leader only).

        If the batch cannot be sent (an unpicklable leaf, a tensor type that has
        no bytes), the peers are told with :meth:`error` before this raises, so
        they raise too instead of waiting.
        """
        if self.mode == "pickle":
            try:
                self._bcast_object((DATA, batch))
            except (pickle.PicklingError, TypeError, AttributeError) as exc:
                # broadcast_object_list pickles before its first collective, and
                # these are what pickling raises: the peers are still waiting.
                self.error(exc)
                raise
            return
        try:
            # Everything that can fail on bad input happens before the first collective.
            tensors = self._same_dict(batch)
            if tensors is not None:
                slot = self._pack_steady(tensors, may_need_grad=False)
            else:
                tree, tensors = flatten_batch(batch)
                layout = tuple(
                    (str(t.dtype).removeprefix("torch."), tuple(t.shape)) for t in tensors
                )
                spec = _dumps_spec((tree, layout))
                if spec == self._spec:
                    slot = self._pack_steady(tensors)
                else:
                    slot = None
                    slots, total = _slots(layout)
                    head = _align(len(spec), ALIGN)
                    buf = torch.empty(head + total, dtype=torch.uint8, device=self.device)
                    buf[: len(spec)] = torch.frombuffer(bytearray(spec), dtype=torch.uint8)
                    self._pack(buf[head:], tensors, slots)
        except Exception as exc:
            self.error(exc)
            raise
        if slot is not None:
            self._issue(slot)
            return
        # Spec changed: announce it in the buffer size peers expect, then send
        # spec + payload in a second buffer whose size the header announced.
        self._drain()
        self._announce(SPEC, len(spec), total)
        self._bcast(buf)
        self._spec, self._slots, self._payload_nbytes = spec, slots, total
        # The usual batch, a flat dict of tensors, is recognised next time
        # without flattening and pickling it (see _same_dict).
        self._dict_spec = (
            [(k, v.dtype, v.shape) for k, v in batch.items()]
            if type(batch) is dict and all(type(v) is torch.Tensor for v in batch.values())
            else None
        )
        self._ring = [None, None]  # sized for the old spec

    # The steady step of send, in the pieces benchmarks/broadcast.py times one by one.
    def _pack_steady(self, tensors: list[torch.Tensor], may_need_grad: bool = True) -> list[Any]:
        """Copy the tensors of a batch whose spec the peers know into this turn's buffer.

        Offsets and the header are those of the last spec. Two send buffers
        take turns: the broadcast of one is still in flight while the next
        batch is packed into the other (free: :meth:`_issue` waited for its
        broadcast). ``may_need_grad=False`` promises that no tensor requires
        grad, so the copy needs no ``torch.no_grad()``.
        """
        slot = self._ring[self._turn]
        if slot is None:
            buf = torch.empty(
                HEADER_BYTES + self._payload_nbytes, dtype=torch.uint8, device=self.device
            )
            self._header(buf, DATA, self._payload_nbytes)
            payload = buf[HEADER_BYTES:]
            # Typed views into the buffer, made once: each step is then one copy.
            views = [
                payload[off : off + nbytes].view(t.dtype).view(t.shape)
                for t, (off, nbytes) in zip(tensors, self._slots, strict=True)
            ]
            slot = self._ring[self._turn] = [buf, views, None]
        # no_grad is cheaper than a detach() per tensor, but entering it costs as
        # much as checking the batch did: only when a tensor may require grad.
        with torch.no_grad() if may_need_grad else contextlib.nullcontext():
            # One call for every tensor; copy_ converts device and layout.
            torch._foreach_copy_(slot[1], tensors)
        return slot

    def _issue(self, slot: list[Any]) -> None:
        # The previous broadcast must end first: with two in flight, gloo runs
        # them on two worker threads that compete with this one for the core,
        # and a 64 KiB step was 3-5% slower here. Its buffer is then free for
        # the next pack.
        _finish(self._ring[self._turn ^ 1])
        # One collective, left running while the caller trains on the batch
        # (collectives on a group run in the order they are issued).
        slot[2] = self._pg.broadcast([slot[0]], self._opts[True])
        self._turn ^= 1

    def _same_dict(self, batch: Any) -> list[torch.Tensor] | None:
        """The tensors of ``batch`` if it is a flat dict of tensors matching the last spec.

        A shortcut for the steady state: same keys in the same order, same
        dtypes and shapes, so the pickled spec would be the same bytes; and no
        tensor that requires grad.
        """
        expected = self._dict_spec
        if expected is None or type(batch) is not dict or len(batch) != len(expected):
            return None
        tensors = []
        for (key, value), (k, dtype, shape) in zip(batch.items(), expected, strict=True):
            # type(key): 1, 1.0 and True are equal keys but pickle differently.
            if (
                key != k
                or type(key) is not type(k)
                or type(value) is not torch.Tensor
                or value.dtype != dtype
                or value.shape != shape
                or value.requires_grad  # the long way copies those under no_grad
            ):
                return None
            tensors.append(value)
        return tensors

    def _drain(self) -> None:
        # Wait for the broadcasts still in flight, so that their errors surface
        # here and the end of an epoch means every batch was delivered.
        for slot in self._ring:
            _finish(slot)

    def end(self) -> None:
        """Tell the peers the leader's loader is exhausted (leader only)."""
        self._drain()
        if self.mode == "pickle":
            self._bcast_object((END, None))
        else:
            self._announce(END)

    def error(self, exc: BaseException) -> None:
        """Tell the peers the leader raised ``exc`` while loading (leader only)."""
        info = {
            "rank": dist.get_rank(),
            "type": type(exc).__name__,
            "message": str(exc),
            "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        }
        self._drain()
        if self.mode == "pickle":
            self._bcast_object((ERROR, info))
            return
        blob = pickle.dumps(info)
        self._announce(ERROR, len(blob))
        self._bcast(torch.frombuffer(bytearray(blob), dtype=torch.uint8).to(self.device))

    # ------------------------------------------------------------------- peers
    def recv(self) -> tuple[str, Any]:
        """Receive one step from the leader (non-leaders only).

        Returns:
            ``("data", batch)``, ``("end", None)`` or ``("error", info)`` where
            ``info`` is a dict with the leader's global ``rank``, exception
            ``type``, ``message`` and ``traceback``. The batch's tensors are
            the caller's as long as it holds any of them (or anything made from
            them); only then is their memory reused for a later batch.
        """
        if self.mode == "pickle":
            kind, payload = self._bcast_object(None)
            return _KIND_NAMES[kind], payload
        rb = self._recv_buffer()
        self._bcast(rb.buf)
        kind, a, b = self._read_header(rb)
        if kind == DATA:
            self._recv_turn ^= 1  # lent out: the other buffer is the next candidate
            return "data", self._batch(rb)
        if kind == END:
            return "end", None
        if kind == ERROR:
            blob = torch.empty(a, dtype=torch.uint8, device=self.device)
            self._bcast(blob)
            return "error", pickle.loads(_to_bytes(blob))
        if kind != SPEC:
            raise RuntimeError(f"TP broadcast: unknown header word {kind}; ranks out of step?")
        head = _align(a, ALIGN)
        buf = torch.empty(head + b, dtype=torch.uint8, device=self.device)
        self._bcast(buf)
        self._tree, self._layout = pickle.loads(_to_bytes(buf[:a]))
        self._slots, self._payload_nbytes = _slots(self._layout)
        self._views = []
        for (name, shape), (off, _) in zip(self._layout, self._slots, strict=True):
            dtype = getattr(torch, name)
            stride = torch.empty(shape, device="meta").stride()
            self._views.append((dtype, tuple(shape), stride, off, dtype.itemsize))
        self._recv_ring = [None, None]  # sized for the old spec
        # This first batch of the new spec keeps the spec's buffer to itself.
        return "data", unflatten_batch(self._tree, self._unpack(buf, head))

    # The steady step of recv, in the pieces benchmarks/broadcast.py times one by one.
    def _recv_buffer(self) -> _RecvBuffer:
        """The buffer to receive the next step into: this turn's, if nothing else holds it."""
        rb = self._recv_ring[self._recv_turn]
        if rb is not None and rb.idle is not None and _holders(rb.buf, rb.tensors) == rb.idle:
            return rb
        buf = torch.empty(
            HEADER_BYTES + self._payload_nbytes, dtype=torch.uint8, device=self.device
        )
        tensors = self._unpack(buf, HEADER_BYTES)
        header: Any = None
        idle = None
        if self.device.type == "cpu":
            header = buf[:HEADER_BYTES].numpy()
            idle = _holders(buf, tensors) if _CAN_RECYCLE else None
        rb = self._recv_ring[self._recv_turn] = _RecvBuffer(buf, header, tensors, idle)
        return rb

    def _read_header(self, rb: _RecvBuffer) -> tuple[int, int, int]:
        # struct on a numpy view: fewer calls than tolist(), which shows at small batches.
        words: Any = rb.header if rb.header is not None else rb.buf[:HEADER_BYTES].cpu().numpy()
        kind, a, b, _ = _HEADER.unpack_from(words)
        return kind, a, b

    def _batch(self, rb: _RecvBuffer) -> Any:
        return unflatten_batch(self._tree, rb.tensors)

    # ----------------------------------------------------------------- helpers
    def _header(self, buf: torch.Tensor, kind: int, a: int = 0, b: int = 0) -> None:
        buf[:HEADER_BYTES].view(torch.int64).copy_(torch.tensor([kind, a, b, 0], dtype=torch.int64))

    def _announce(self, kind: int, a: int = 0, b: int = 0) -> None:
        # Sized like a data step so peers, who cannot know what comes, match it.
        # Every caller drained first, so no broadcast reads the send buffers: one
        # carries the announcement (peers ignore its payload) and gets its DATA
        # header back. A new buffer each time was an allocation and a fill of the
        # whole step's size once an epoch (1 MiB at 32x2048), in the loop's tail.
        slot = self._ring[self._turn]
        if slot is not None and slot[2] is None:
            self._header(slot[0], kind, a, b)
            try:
                self._bcast(slot[0])
            finally:
                self._header(slot[0], DATA, self._payload_nbytes)
            return
        buf = torch.zeros(
            HEADER_BYTES + self._payload_nbytes, dtype=torch.uint8, device=self.device
        )
        self._header(buf, kind, a, b)
        self._bcast(buf)

    def _pack(
        self, payload: torch.Tensor, tensors: list[torch.Tensor], slots: list[tuple[int, int]]
    ) -> None:
        for t, (off, nbytes) in zip(tensors, slots, strict=True):
            # copy_ converts device and layout (non-contiguous, 0-d) in one pass.
            payload[off : off + nbytes].view(t.dtype).view(t.shape).copy_(t.detach())

    def _unpack(self, buf: torch.Tensor, base: int) -> list[torch.Tensor]:
        """The spec's tensors as views into ``buf``, whose payload starts at ``base``."""
        # One typed view of the whole buffer per dtype, then one as_strided per
        # tensor: fewer torch calls than slicing. ALIGN makes the buffer's
        # length a multiple of any itemsize. A comprehension, so that no local
        # name is left holding a tensor when _recv_buffer counts the holders.
        typed = {dtype: buf.view(dtype) for dtype in {v[0] for v in self._views}}
        return [
            typed[dtype].as_strided(shape, stride, (base + off) // itemsize)
            for dtype, shape, stride, off, itemsize in self._views
        ]

    def _bcast(self, buf: torch.Tensor) -> None:
        work = self._pg.broadcast([buf], self._opts[False])
        if work is not None:  # some backends finish inside the call
            work.wait()

    def _bcast_object(self, obj: Any) -> Any:
        box = [obj]
        device = self.device if self.device.type == "cuda" else None
        dist.broadcast_object_list(box, src=self.src, group=self.group, device=device)
        return box[0]
