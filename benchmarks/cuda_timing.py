"""Host timers against CUDA events on a GPU step: which one sees the kernels? Prints one table.

On a GPU, ``model(batch)`` and ``loss.backward()`` return as soon as their kernels
are **queued**: a ``time.perf_counter()`` pair around them measures the launches,
and the kernels' time shows up later, in whatever call first waits for the device
(``.item()``, a blocking copy, a collective). That is why the ledger's host-timer
step times are true on CPUs (gloo) and misleading on GPUs: a rank's compute looks
short, and a straggler's wait surfaces at the next synchronisation, so
``Ledger.diagnose()`` would blame the wrong phase. On CUDA, time a phase with
``torch.cuda.Event(enable_timing=True)`` pairs recorded on the stream (read after
the step), or call ``torch.cuda.synchronize()`` before each host timestamp when
you ask for timings (it costs the overlap of host and device).

A step of 4 matmuls (4096 x 4096, float32) is timed three ways:

* host timer, launches only: ``perf_counter`` before and after the calls;
* CUDA events: recorded before and after on the current stream;
* host timer + synchronize: ``perf_counter`` after ``torch.cuda.synchronize()``.

The check (``make gpu-check``): the events agree with the synchronised host timer
(within 25 %), and the launch-only host timer sees under a tenth of it. Exit 1 if
not.

Run: ``.venv/bin/python benchmarks/cuda_timing.py`` on a machine with CUDA;
without CUDA it says so and exits 0.
"""

from __future__ import annotations

import statistics
import time

import torch


def step_times(work: torch.Tensor, reps: int = 20) -> tuple[float, float, float]:
    """Median ms of one step: host timer (launches), CUDA events, host timer + sync."""
    launch, events, synced = [], [], []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        start.record()
        for _ in range(4):
            work @ work
        end.record()
        t1 = time.perf_counter()  # the kernels are queued, not done
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        launch.append(t1 - t0)
        synced.append(t2 - t0)
        events.append(start.elapsed_time(end) / 1e3)  # ms -> s
    ms = [1e3 * statistics.median(x) for x in (launch, events, synced)]
    return ms[0], ms[1], ms[2]


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: host timers and CUDA events agree on a CPU")
        return 0
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    work = torch.randn(4096, 4096, device="cuda")
    step_times(work, reps=3)  # warm-up: cuBLAS picks its kernels
    launch, events, synced = step_times(work)
    print("\n| step of 4 matmuls timed by | ms (median of 20) |")
    print("|---|---|")
    print(f"| host timer, launches only | {launch:.3f} |")
    print(f"| CUDA events | {events:.3f} |")
    print(f"| host timer after synchronize | {synced:.3f} |")
    ok = abs(events - synced) <= 0.25 * synced and launch < 0.1 * synced
    print("events see the kernels, the host timer alone does not" if ok else "UNEXPECTED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
