"""Each run's /tmp in the landlock mode: a directory of its own under the runtime's, capped by the watcher.

Runs there share the service's uid, so the chroot mode's directories per uid in a tree
(tmpcap.RunDirectories) cannot be had: each run gets a fresh directory under the runtime's
own parent (tempdirs.py), the only place its Landlock domain lets it write, seen at the
same path inside (there is no tree). The watcher caps it as it caps the chroot mode's
(bytes and files: everything in it is the run's, every file being of the shared uid), and it
is removed once the run's process is dead.
"""

from __future__ import annotations

import tempfile

from runtimes.jail.tmp.caps import RunDirectories, TmpWatcher


class SharedRunDirectories(RunDirectories):
    def __init__(self, watcher: TmpWatcher, max_bytes: int, max_files: int, parent: str, counts_held: bool = True):
        super().__init__(watcher, max_bytes, max_files, counts_held)
        self.parent = parent

    def needs_cell(self, tree_root: str, uid: int) -> bool:
        return False  # no tree, no cells: a directory under the runtime's own

    def make(self, tree_root: str, uid: int) -> tuple[str, str]:
        """A fresh directory for the next run: the service's path to it and the run's are the same."""
        path = tempfile.mkdtemp(prefix="run-", dir=self.parent)
        return path, path
