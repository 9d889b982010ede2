"""Removing a directory a run wrote in, whatever it did to it: depth, width, symlinks and modes.

A run may nest directories past any recursion limit and PATH_MAX, plant symlinks, and (where it shares the
remover's uid and the remover holds no capability: the landlock jail, a Lambda function) leave directories
their owner cannot list, search or write (mkdir 0300, a mode changed before a rule refused it): removal opens
no path longer than two names, follows no symlink, and gives every directory back its owner's rwx before it
reads or empties it (chmod needs ownership only, which the remover has; as root it changes nothing that
matters). Nothing may write there meanwhile (the run's processes are gone).

Standard library only.
"""

from __future__ import annotations

import errno
import logging
import os
import stat

log = logging.getLogger("sandlot.jail")

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
OWNER_ALL = stat.S_IRWXU


def _restore(name: str, dir_fd: int | None) -> None:
    """Give the directory name (under dir_fd) its owner's rwx, without following a symlink."""
    try:
        os.chmod(name, OWNER_ALL, dir_fd=dir_fd, follow_symlinks=False)
        return
    except NotImplementedError:
        pass
    except OSError as exc:
        if exc.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS):
            raise
    fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        os.chmod(f"/proc/self/fd/{fd}", OWNER_ALL)
    finally:
        os.close(fd)


def _open_dir(name: str, dir_fd: int | None) -> int:
    """The directory opened for listing and emptying: rwx for its owner first where it lacked them."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except PermissionError:
        _restore(name, dir_fd)
        fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) & OWNER_ALL != OWNER_ALL:
            os.fchmod(fd, OWNER_ALL)
    except BaseException:
        os.close(fd)
        raise
    return fd


def remove_tree(path: str) -> None:
    """Remove a directory and everything in it (see the module): every directory found is first moved up to
    the top, so no path is ever longer than two names and two descriptors are open at most."""
    top = _open_dir(path, None)
    try:
        hoisted = 0
        queue = [""]  # directories directly under the top still to empty ("" is the top itself)
        while queue:
            name = queue.pop()
            try:
                fd = _open_dir(name, top) if name else os.dup(top)
            except FileNotFoundError:
                continue
            try:
                with os.scandir(fd) as entries:
                    names = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in entries]
                for child, is_dir in names:
                    if not is_dir:
                        os.unlink(child, dir_fd=fd)
                        continue
                    if not name:
                        queue.append(child)  # already at the top
                        continue
                    # moving a directory to another parent writes its "..": its owner needs w on it
                    if stat.S_IMODE(os.stat(child, dir_fd=fd, follow_symlinks=False).st_mode) & 0o200 == 0:
                        _restore(child, fd)
                    while True:  # a fresh name at the top (onto an empty directory would do too: it goes)
                        hoisted += 1
                        target = f".sandlot-rm-{hoisted}"
                        try:
                            os.rename(child, target, src_dir_fd=fd, dst_dir_fd=top)
                            break
                        except OSError as exc:
                            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                                raise
                    queue.append(target)
            finally:
                os.close(fd)
            if name:
                os.rmdir(name, dir_fd=top)
    finally:
        os.close(top)
    os.rmdir(path)


def remove(path: str) -> None:
    """remove_tree for a directory, unlink for anything else (never following a symlink); nothing if gone."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        remove_tree(path)
    else:
        os.unlink(path)


def remove_quietly(path: str) -> bool:
    """remove(), logging what could not be removed instead of raising; whether path is gone."""
    try:
        remove(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("could not remove %s: %s", path, exc)
        return False
    return True
