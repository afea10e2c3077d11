"""Types that batches carry through the TP broadcast in the tests.

The broadcast pickles a batch's structure with plain pickle on the ranks, which finds
a class by its module and name. The test modules travel to the ranks by value (see
conftest.py), so a class defined in one would be a copy there that pickle refuses
("not the same object"); defined here, the ranks import it (no pytest needed).
"""

from __future__ import annotations

import collections

Point = collections.namedtuple("Point", "x y")
