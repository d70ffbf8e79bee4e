"""glibc's threshold for giving large blocks their own mapping, fixed in a runner's process.

Left dynamic (glibc's default), the threshold rises each time a large mapped block is freed, and later blocks of that
size come from the heap instead, where freed memory is kept: an instance's memory then depends on the order of the
batch sizes it ran (bert_base on ONNX Runtime after batches of 1-4: 552 or 698 MB by that order; 479 MB every time
with the threshold fixed, at the same speed; docs/serve.md#memory-per-instance-and-energy). Each runner fixes it at
glibc's initial 128 KiB when its instance starts, before it loads its model; the server's own process keeps glibc's
default.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
MMAP_THRESHOLD_BYTES = 128 * 1024


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fix this process's mmap threshold at ``threshold`` bytes (no dynamic rise from now on): whether glibc took it
    (False where the C library is not glibc)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, int(threshold)))
    except (OSError, AttributeError):
        return False
