"""Types that batches carry through the TP broadcast in the tests.

The broadcast pickles a batch's structure with plain pickle, which finds a class by
its module and name; defined here, the ranks import it (no pytest needed), so these
types take that path. A type pickle cannot name (one defined in a notebook cell, or
in the job itself) goes by value with cloudpickle instead: test_broadcast.py covers it.
"""

from __future__ import annotations

import collections

Point = collections.namedtuple("Point", "x y")
