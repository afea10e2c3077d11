"""What do ``pin_memory``, ``non_blocking`` and a copy stream buy on this GPU? Prints two tables.

A batch of ``(32, 2048)`` int64 tokens (512 KiB) and one of ``(32, 3, 224, 224)``
float32 images (18 MiB) go from host to device in a loop, while the device
runs a matmul standing in for the previous step's kernels:

* pageable, blocking:     ``batch.to("cuda")`` from ordinary memory;
* pinned, blocking:       from page-locked memory (``DataLoader(pin_memory=True)``);
* pinned, non_blocking:   ``batch.to("cuda", non_blocking=True)``: the copy is
  queued and the **host** goes on. On the device the copy is queued on the same
  stream as the kernels, so it runs after them, not beside them.

Per copy: the host's time in the call (what the training loop waits for) and
the wall time of a step (kernel + copy, synchronised). A blocking copy on the
default stream also waits for the kernels queued before it, so its host time
is the kernel's plus the copy's; a non-blocking copy from pinned memory returns
at once. A pageable copy with ``non_blocking=True`` is staged through a pinned
buffer and blocks anyway.

Measured on one H200 (torch 2.11, CUDA 13.0): host time in ``.to()`` 2.7 ms
(tokens) and 3.0-4.2 ms (images) blocking, 0.02-0.03 ms pinned non-blocking;
the images' step 4.3 ms from pageable memory, 3.1 ms from pinned; the step
(kernel + copy) is the same with and without ``non_blocking``: no overlap on the
device.

The second table is the prefetch that does overlap: each step copies the
**next** batch on a side stream (``torch.cuda.Stream()``) while this step's
kernels run on the default one; the step waits for its own batch with
``wait_stream`` and marks it ``record_stream`` so the allocator does not reuse
its memory early. Step times there are CUDA events on the default stream (the
device's time, not the host's launches); the same loop with the copy on the
default stream is the baseline.

Run: ``.venv/bin/python benchmarks/pin_memory.py`` on a machine with CUDA
(``make gpu-check`` runs it); without CUDA it says so and exits 0.
"""

from __future__ import annotations

import statistics
import time

import torch

SHAPES: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
    "tokens (32, 2048) int64": ((32, 2048), torch.int64),
    "images (32, 3, 224, 224) float32": ((32, 3, 224, 224), torch.float32),
}


def measure(
    batch: torch.Tensor, non_blocking: bool, work: torch.Tensor, reps: int = 30
) -> tuple[float, float]:
    """Median host time in ``.to()`` and median step wall time, in ms."""
    host, step = [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        work @ work  # the previous step's kernels, queued on the device
        t1 = time.perf_counter()
        batch.to("cuda", non_blocking=non_blocking)
        t2 = time.perf_counter()
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        host.append(t2 - t1)
        step.append(t3 - t0)
    return 1e3 * statistics.median(host), 1e3 * statistics.median(step)


def prefetch_step_ms(batch: torch.Tensor, work: torch.Tensor, side: bool, steps: int = 30) -> float:
    """Device ms per step: this step's matmul while the next batch is copied.

    ``side=False`` queues the copy on the default stream (after the step before it:
    kernel + copy in turn); ``side=True`` on a copy stream (kernel and copy at once).
    """
    main = torch.cuda.current_stream()
    copy = torch.cuda.Stream() if side else main
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record(main)
    with torch.cuda.stream(copy):
        upcoming = batch.to("cuda", non_blocking=True)
    for step in range(steps):
        main.wait_stream(copy)  # this step's batch has arrived
        current = upcoming
        current.record_stream(main)  # in use on main: not reused by the copy stream early
        if step + 1 < steps:
            with torch.cuda.stream(copy):
                upcoming = batch.to("cuda", non_blocking=True)  # the next step's batch
        work @ work  # this step's kernels
        current.sum()
    end.record(main)
    end.synchronize()
    return start.elapsed_time(end) / steps


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: pin_memory and non_blocking have nothing to show on a CPU")
        return 0
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    work = torch.randn(4096, 4096, device="cuda")
    print("\n| batch | copy | host time in .to() (ms) | step: kernel + copy (ms) |")
    print("|---|---|---|---|")
    for name, (shape, dtype) in SHAPES.items():
        pageable = torch.ones(shape, dtype=dtype)
        pinned = pageable.pin_memory()
        for label, batch, nb in (
            ("pageable, blocking", pageable, False),
            ("pinned, blocking", pinned, False),
            ("pinned, non_blocking", pinned, True),
        ):
            measure(batch, nb, work, reps=3)  # warm-up
            host, step = measure(batch, nb, work)
            print(f"| {name} | {label} | {host:.3f} | {step:.3f} |")
    print("\n| batch (pinned) | next batch copied on | step, CUDA events (ms) |")
    print("|---|---|---|")
    for name, (shape, dtype) in SHAPES.items():
        pinned = torch.ones(shape, dtype=dtype).pin_memory()
        for label, side in (("the default stream", False), ("a side stream", True)):
            prefetch_step_ms(pinned, work, side, steps=3)  # warm-up
            print(f"| {name} | {label} | {prefetch_step_ms(pinned, work, side):.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
