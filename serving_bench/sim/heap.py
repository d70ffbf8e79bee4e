"""A binary min-heap of :class:`Entry` items, ordered by ``(key, seq)``: the fast engine's events and each device's
running jobs.

``seq`` is unique per heap, so the order is total and any correct heap pops the same sequence (the engines' results
do not depend on how the heap is laid out). Each item knows its place (``pos``), so an item can be moved to a new
``(key, seq)`` or taken out where it is: an event that is re-planned is moved rather than left behind as a stale
copy. Compiled (``heap.pxd``), an ordering test is two C comparisons of typed fields, where :mod:`heapq` on tuples
compares Python objects element by element.
"""

from __future__ import annotations

import math

INF = math.inf

class Entry:
    """An item of a heap: ``key`` (a time, seconds; or a virtual time), a unique ``seq`` that breaks ties, and its
    place in the heap (``pos``; -1: not in one)."""

    __slots__ = ("key", "seq", "pos")

    def __init__(self, key: float = 0.0, seq: int = 0):
        self.key = key
        self.seq = seq
        self.pos = -1


class Heap:
    """The heap: ``n`` items in ``items[:n]`` (``items[0]`` first); ``first_key`` the first item's key (inf when
    empty). The list keeps its length when items leave, so that a heap that fills and empties again and again (a
    device's jobs of one kind) does not reallocate it each time."""

    __slots__ = ("items", "n", "first_key")

    def __init__(self):
        self.items: list[Entry | None] = []
        self.n = 0
        self.first_key = INF

    def push(self, item: Entry) -> None:
        """Add ``item`` (not in a heap)."""
        n = self.n
        if n < len(self.items):
            self.items[n] = item
        else:
            self.items.append(item)
        self.n = n + 1
        item.pos = n
        self._up(item)
        self._first()

    def pop(self) -> Entry:
        """Remove and return the first item of a non-empty heap."""
        first = self.items[0]
        self.remove(first)
        return first

    def remove(self, item: Entry) -> None:
        """Take ``item`` out of this heap."""
        items = self.items
        self.n -= 1
        last = items[self.n]
        items[self.n] = None
        i = item.pos
        item.pos = -1
        if last is not item:
            items[i] = last
            last.pos = i
            self._down(last)
            self._up(last)
        self._first()

    def place(self, item: Entry) -> None:
        """``item``'s ``key`` or ``seq`` may have changed: put it where it now belongs (adding it if not in)."""
        if item.pos < 0:
            self.push(item)
        else:
            self._down(item)
            self._up(item)
            self._first()

    def _first(self) -> None:
        if self.n:
            first = self.items[0]
            self.first_key = first.key
        else:
            self.first_key = INF

    def _up(self, item: Entry) -> None:
        items = self.items
        i = item.pos
        while i > 0:
            parent = (i - 1) >> 1
            above = items[parent]
            if not _before(item, above):
                break
            items[i] = above
            above.pos = i
            i = parent
        items[i] = item
        item.pos = i

    def _down(self, item: Entry) -> None:
        items = self.items
        n = self.n
        i = item.pos
        while True:
            child = 2 * i + 1
            if child >= n:
                break
            below = items[child]
            if child + 1 < n and _before(items[child + 1], below):
                child += 1
                below = items[child]
            if not _before(below, item):
                break
            items[i] = below
            below.pos = i
            i = child
        items[i] = item
        item.pos = i


def _before(a: Entry, b: Entry) -> bool:
    return a.key < b.key or (a.key == b.key and a.seq < b.seq)
