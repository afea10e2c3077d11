"""Imported only by multiprocessing's forkserver, as a preload, when it starts.

It moves the forkserver into a process group of its own. When Jupyter shuts a
kernel down, ipykernel signals every child in the kernel's process group and
waits until none is left. The forkserver dies at once but stays a zombie (the
kernel never reaps it), so the kernel waits out its grace period, is killed
by its manager, and skips its exit handlers: multiprocessing's ``pymp-*``
folder then stays in the temporary directory, and every shutdown takes 2.5 s.
Outside the kernel's group the forkserver is left alone; it exits by itself
when the kernel, exiting, closes its end of the forkserver's "alive" pipe.
Its children inherit the new group: ranks make their own anyway, and other
multiprocessing children of the kernel are still ended by multiprocessing's
exit handler, which now runs.
"""

import os
import sys

# Only in the forkserver itself (started as ``python -c "from
# multiprocessing.forkserver import main; ..."``), should anything else import this.
if (
    sys.argv == ["-c"]
    and "multiprocessing.forkserver" in sys.modules
    and os.getpgrp() != os.getpid()
):
    try:
        os.setpgrp()
    except OSError:  # not allowed here (e.g. a session leader): keep the old behaviour
        pass
