"""The RDMA transport's registration cache (traffic.rdma): the memory regions of the agent's buffers, registered once
and reused, as perftest registers its buffer once before it writes.

ibv_reg_mr pins pages and builds the device's translation table: costly per call, and under software emulation
far more than a message's posting. The agent reuses the same numpy buffers for every execution of an op, so the
whole underlying array of a buffer is registered the first time a view of it is sent or received into, and every
later view of it finds that region: first by (address, length) in a dict, then by a scan of the registered ranges.
``register(length, address)`` is the transport's (an MR of its protection domain); anything with ``lkey`` and
``rkey`` will do, so the lookup is tested without a device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


class RegistrationCache:
    """Registered ranges of memory: (start, end, MR, the object kept alive while it is registered)."""

    def __init__(self, register: Callable[[int, int], Any]):
        self.register = register
        self.ranges: list[tuple[int, int, Any, Any]] = []
        self.exact: dict[tuple[int, int], Any] = {}  # (address, length) of a view seen before -> its MR
        self.hits = self.misses = 0

    def region(self, buf) -> tuple[Any, int]:
        """(MR, address) of the bytes of ``buf`` (a memoryview of a numpy array, or any buffer); registers the
        whole underlying C-contiguous array the first time (exceptions from ``register`` pass through)."""
        arr = np.frombuffer(buf, dtype=np.uint8)
        a, n = arr.ctypes.data, len(arr)
        mr = self.exact.get((a, n))
        if mr is not None:
            self.hits += 1
            return mr, a
        for start, end, mr, _ in self.ranges:
            if start <= a and a + n <= end:
                self.exact[(a, n)] = mr
                self.hits += 1
                return mr, a
        self.misses += 1
        start, length, owner = self.extent(buf, a, n)
        mr = self.register(max(length, 1), start)
        self.ranges.append((start, start + length, mr, owner))
        self.exact[(a, n)] = mr
        return mr, a

    @staticmethod
    def extent(buf, a: int, n: int) -> tuple[int, int, Any]:
        """(start, length, owner) to register for the view at ``a`` of ``n`` bytes: the whole numpy array it is a
        view of when that is C-contiguous and holds it, else the view itself."""
        root = buf.obj if isinstance(buf, memoryview) else None
        while isinstance(root, np.ndarray) and isinstance(root.base, (np.ndarray, bytearray, bytes)):
            root = root.base
        if isinstance(root, np.ndarray) and root.flags.c_contiguous:
            rs = root.ctypes.data
            if rs <= a and a + n <= rs + root.nbytes:
                return rs, root.nbytes, root
        return a, n, buf

    def regions(self) -> list:
        return [mr for _, _, mr, _ in self.ranges]

    def clear(self) -> None:
        self.ranges.clear()
        self.exact.clear()
