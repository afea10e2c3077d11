"""Imported only by multiprocessing's forkserver, as a preload, when it starts.

It moves the forkserver into a process group of its own. When Jupyter shuts a
kernel down, ipykernel signals every child in the kernel's process group and
waits until none is left. The forkserver dies at once but stays a zombie (the
kernel never reaps it), so the kernel waits out its grace period, is killed
by its manager, and skips its exit handlers: multiprocessing's ``pymp-*``
folder then stays in the temporary directory, and every shutdown takes 2.5 s.
Outside the kernel's group the forkserver is left alone; it exits by itself
when the kernel, exiting, closes its end of the forkserver's "alive" pipe.
"""

import os

if os.getpgrp() != os.getpid():
    try:
        os.setpgrp()
    except OSError:  # not allowed here (e.g. a session leader): keep the old behaviour
        pass
