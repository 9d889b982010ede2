"""The zygote's warm heap made cheap to fork: fewer pages, and in huge pages where they can be.

Every fork copies the page table entries of the zygote's anonymous memory and
takes a reference on each page; every run's end drops them again. A page that is
part of a huge page is counted with its neighbours in one step (the kernel
batches the entries of one large folio at fork and at unmap). So once the
zygote has warmed and frozen its heap, `collapse` asks the kernel to put each
aligned 2 MiB of its anonymous memory into one huge page (MADV_COLLAPSE, Linux
6.1+, independent of the machine's THP setting). A write to such a page after a
fork still copies 4 KiB only: the huge page is split in the writer's page
table, and stays one folio for the batching.

Before that, the zygote gives back to the kernel the pages of malloc's heap that
only hold freed memory (the imports' garbage; `syscalls.malloc_trim`): they are
neither copied at a fork nor counted at a run's end, and a child that allocates
there (outside a huge page) gets a zero page instead of a copy.

Nothing depends on either: a kernel, C library or platform that refuses them
(older kernels, musl, a seccomp policy, no memory for a huge page) leaves the
heap as it was.
"""

from __future__ import annotations

import errno
import os

from runtimes.linux import syscalls

HUGE_PAGE = 2 * 1024 * 1024


class Maps:
    """/proc/self/maps, opened before the zygote enters a tree that has no /proc."""

    def __init__(self) -> None:
        self.fd = syscalls.open_own("maps")

    def anonymous(self) -> list[tuple[int, int]]:
        """The private, writable, anonymous mappings (the heap, malloc's and the interpreter's arenas)."""
        if self.fd < 0:
            return []
        text = b"".join(iter(lambda: os.read(self.fd, 1 << 16), b""))
        os.lseek(self.fd, 0, os.SEEK_SET)
        ranges = []
        for line in text.decode().splitlines():
            fields = line.split()
            name = fields[5] if len(fields) > 5 else ""
            if fields[1] == "rw-p" and name in ("", "[heap]"):
                low, high = (int(x, 16) for x in fields[0].split("-"))
                ranges.append((low, high))
        return ranges

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def collapse(maps: Maps) -> int:
    """Each aligned 2 MiB of anonymous memory into a huge page; returns how many were made."""
    made = 0
    for low, high in maps.anonymous():
        start = -(-low // HUGE_PAGE) * HUGE_PAGE
        for address in range(start, high - HUGE_PAGE + 1, HUGE_PAGE):
            try:
                syscalls.madvise(address, HUGE_PAGE, syscalls.MADV_COLLAPSE)
            except OSError as exc:
                if exc.errno in (errno.EINVAL, errno.EPERM, errno.ENOSYS):
                    return made  # not on this kernel or platform
                continue  # this range only (EAGAIN, ENOMEM: no huge page free now)
            made += 1
    return made
