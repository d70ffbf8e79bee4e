# cython: boundscheck=False, wraparound=False, initializedcheck=False
# (compiled without index checks: every index used here is below its array's length by construction)
"""Entries ordered by ``(key, seq)``: a binary min-heap of :class:`Entry` items (the fast engine's one-off events,
each device's running jobs) and a :class:`Calendar` of recurring ones at fixed places (the fast engine's timers,
waking arrivals and device completions).

``seq`` is unique per heap, so the order is total and any correct heap pops the same sequence (the engines' results
do not depend on how the heap is laid out). Each item knows its place (``pos``), so an item can be moved to a new
``(key, seq)`` or taken out where it is: an event that is re-planned is moved rather than left behind as a stale
copy. Compiled (``heap.pxd``), an ordering test is two C comparisons of typed arrays, where :mod:`heapq` on tuples
compares Python objects element by element.
"""

from __future__ import annotations

import math

import numpy as np

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
    """The heap: ``n`` items in ``items[:n]`` (``items[0]`` first), with each place's ``(key, seq)`` kept beside them
    in ``keys`` and ``seqs`` (typed arrays: ordering never touches the items); ``first_key`` the first item's key (inf
    when empty). The arrays only grow, so a heap that fills and empties again and again (a device's jobs of one kind)
    allocates nothing."""

    __slots__ = ("items", "keys", "seqs", "n", "first_key")

    def __init__(self, capacity: int = 8):
        self.items: list[Entry | None] = [None] * capacity
        self.keys = np.empty(capacity)
        self.seqs = np.empty(capacity, dtype=np.int64)
        self.n = 0
        self.first_key = INF

    def push(self, item: Entry) -> None:
        """Add ``item`` (not in a heap)."""
        n = self.n
        if n == len(self.items):
            self._grow()
        self.n = n + 1
        self._settle(item, n)

    def pop(self) -> Entry:
        """Remove and return the first item of a non-empty heap."""
        first = self.items[0]
        self.remove(first)
        return first

    def remove(self, item: Entry) -> None:
        """Take ``item`` out of this heap."""
        self.n -= 1
        n = self.n
        i = item.pos
        item.pos = -1
        last = self.items[n]
        self.items[n] = None
        if last is not item:
            self._settle(last, i)
        elif n == 0:
            self.first_key = INF

    def place(self, item: Entry) -> None:
        """``item``'s ``key`` or ``seq`` may have changed: put it where it now belongs (adding it if not in)."""
        if item.pos < 0:
            self.push(item)
        else:
            self._settle(item, item.pos)

    def _settle(self, item: Entry, i: int) -> None:
        """Put ``item`` at the free place ``i`` and move it down or up to where its ``(key, seq)`` belongs."""
        n = self.n
        key, seq = item.key, item.seq
        while True:
            child = 2 * i + 1
            if child >= n:
                break
            if child + 1 < n and _before(self.keys[child + 1], self.seqs[child + 1], self.keys[child],
                                         self.seqs[child]):
                child += 1
            if not _before(self.keys[child], self.seqs[child], key, seq):
                break
            self._move(child, i)
            i = child
        while i > 0:
            parent = (i - 1) >> 1
            if not _before(key, seq, self.keys[parent], self.seqs[parent]):
                break
            self._move(parent, i)
            i = parent
        self.items[i] = item
        self.keys[i] = key
        self.seqs[i] = seq
        item.pos = i
        self.first_key = self.keys[0]

    def _move(self, source: int, to: int) -> None:
        moved = self.items[source]
        self.items[to] = moved
        self.keys[to] = self.keys[source]
        self.seqs[to] = self.seqs[source]
        moved.pos = to

    def _grow(self) -> None:
        size = len(self.items)
        self.items.extend([None] * size)
        keys = np.empty(2 * size)
        keys[:size] = self.keys
        self.keys = keys
        seqs = np.empty(2 * size, dtype=np.int64)
        seqs[:size] = self.seqs
        self.seqs = seqs


class Calendar:
    """Recurring entries at fixed places ``0 .. size - 1``, each planned at one ``(key, seq)`` or not at all (key inf),
    kept in typed arrays and scanned for the first: for a few dozen places cheaper than a heap, since planning one is
    two stores. The first place is found again only when it may have changed (``known`` false)."""

    __slots__ = ("keys", "seqs", "first", "known")

    def __init__(self, size: int):
        self.keys = np.full(size, INF)
        self.seqs = np.zeros(size, dtype=np.int64)
        self.first = -1  # the first planned place (-1: none), when known
        self.known = True

    def plan(self, i: int, key: float, seq: int) -> None:
        """Plan place ``i`` at ``(key, seq)`` (instead of whatever it was planned at)."""
        self.keys[i] = key
        self.seqs[i] = seq
        if self.known:
            first = self.first
            if first < 0 or (first != i and _before(key, seq, self.keys[first], self.seqs[first])):
                self.first = i
            elif first == i:  # the first moved: another place may come first now
                self.known = False

    def before(self, i: int, key: float, seq: int) -> bool:
        """Does place ``i``'s entry come before ``(key, seq)``?"""
        return _before(self.keys[i], self.seqs[i], key, seq)

    def unplan(self, i: int) -> None:
        self.keys[i] = INF
        if i == self.first:
            self.known = False

    def first_place(self) -> int:
        """The place planned first (-1: none)."""
        if not self.known:
            first = -1
            for i in range(len(self.keys)):
                if self.keys[i] < INF and (first < 0 or _before(self.keys[i], self.seqs[i], self.keys[first],
                                                                self.seqs[first])):
                    first = i
            self.first = first
            self.known = True
        return self.first


def _before(key: float, seq: int, other_key: float, other_seq: int) -> bool:
    """Does ``(key, seq)`` come before ``(other_key, other_seq)``?"""
    return key < other_key or (key == other_key and seq < other_seq)
