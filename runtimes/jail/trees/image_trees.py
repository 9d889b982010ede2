"""The chroot jail's trees built into the service image, with their cells, so that a container copies none at start.

On a container's own filesystem (overlayfs) a tree made at start costs a copy of every file (a hard link to a file
of the image copies it up first: tree_store.py), and the copies' inodes and names stay charged to the container. A
tree built when the image is built (`sandlot layers trees`, the Dockerfile) is part of the image: its files are hard
links to the image's own in one layer (the interpreter's, node's, the default layers'), read by every container of
the image from the same pages, and a container starts on it at once.

What differs between containers, and so is left out of an image tree and of its key (image_key):
- the generated files (the run's /etc/hosts names the container's hostname, which `uname()` tells a run in the
  chroot mode, and its resolv.conf the resolvers runs may reach);
- the devices: nodes where this container may make them (mknod), stand-ins where it may not (a user namespace);
  a node made in the image would be refused there, or differ.
Both are written into the tree when a service instance first takes it (finish), as it would have made them.

Cells: on overlayfs a hard link to an image file copies it up, so no cell (the tree again, a hard link per file:
materialized.make_cell) can be made from an image tree at start without copying it all. The image carries them too,
by slot, not by uid (`slots/<n>`: the uids of a block are known only in the container, from its user namespace's
map): a uid's cell is a symlink `cells/<uid>` -> `../slots/<n>` to a slot no other uid has (assign_slot), the
devices and generated files put in the slot then. A slot whose uid has no child in it (no /tmp: no process of that
uid is left, see tree_store.retire_idle_cells) may be given to another uid when every slot is taken: one of this
instance's uids', or one an instance that is gone gave (each holds a lock on its slots while its process lives:
assign_slot, adopt_slot); beyond that a cell is made as in a tree of the container's own (tree_store.make_cells:
slow, every file copied up once).

An operator's layer (dify-sandbox's dependencies file, the package routes) gives the tree spec another key: the image
has no tree of it. The image carries each runtime's layer-less tree too (the tree without its layer, and without the
libraries only the layer's ELF files load), and a spec that differs from it only by additions (additions(): binds
and placed entries the layer-less spec lacks) is served from it, what it adds materialized into it when a container
takes it alone (take: copies, as tree_store makes them on overlayfs, a few MB against the interpreter's 160), and
hard-linked into the slots the first runs take, as each is given (assign_slot: the copies are the container's own
files already, a link copies nothing), and into the others once those runs are served (fill_slots). What was added is
recorded beside the tree (`<tree>.added`), not in it (cells clone the tree's root, and runs would see it), with the
slots that hold all of it: a restarted container with the same additions finds them there; other additions replace
them (the old ones removed from the tree and every slot), only when no live instance holds the tree; one that holds
it with other additions keeps them, and a second instance that wants others builds a tree of its own.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
import stat
import time

from runtimes.jail.policy.tree_files import CELLS
from runtimes.jail.trees import materialized
from runtimes.linux import removal, syscalls

log = logging.getLogger("sandlot.trees")

IMAGE_TREES = "/opt/sandlot/image-trees"  # the service image's trees (Dockerfile: `sandlot layers trees`)
SLOTS = materialized.SLOTS  # an image tree's cells, by slot: cells/<uid> is a symlink to one of them
DEFAULT_SLOTS = 16  # per tree: more than the uids a start and a busy spell of the default settings use
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

# what each image tree this process took holds of its own: its generated files (slots link them)
_finished: dict[str, dict[str, str]] = {}
# the uids this process gave each image tree's slots to: only theirs are ever given to another uid (another
# instance's uids are its own business: it may be making a run's /tmp in one at this very moment)
_assigned: dict[str, set[int]] = {}
# the slots this process gives, by tree: an exclusive flock on each slot's directory, held as long as a uid of this
# process's has it. A slot named by a cell whose lock can be had was given by an instance that is gone: it may be
# given again, whoever holds the tree beside (assign_slot); a live instance's never is
_slot_locks: dict[str, dict[str, int]] = {}
LINKING = ".link-"  # a cell's symlink while it is made, renamed to the uid's name once complete
ADDED = ".added"  # beside an image tree (`<tree>.added`): what was added to it (additions), which entries, and the
# slots that hold them all
NO_ADDITIONS = "none"  # the additions key of a tree as the image built it
# the additions each image tree this process took holds (their key): a later zygote wanting others is not served it
_added: dict[str, str] = {}


def image_spec(spec: dict) -> dict:
    """What of a tree's spec an image tree holds: all but the generated files and the devices."""
    return {**spec, "generated": {}, "devices": []}


def image_key(spec: dict) -> str:
    """The key of spec's image tree: materialized.fingerprint of what an image tree holds (sources' stats included)."""
    return "image-" + materialized.fingerprint(image_spec(spec), device_nodes=False)


def build(spec: dict, image_dir: str, slots: int = DEFAULT_SLOTS) -> tuple[str, bool]:
    """The image tree of spec under image_dir, and its slots' cells; (its path, whether it was built now)."""
    path = os.path.join(image_dir, image_key(spec))
    if os.path.isdir(path):
        return path, False
    os.makedirs(image_dir, mode=0o755, exist_ok=True)
    scratch = f"{path}.build-{time.time_ns()}"
    os.mkdir(scratch, 0o700)
    try:
        materialized.materialize(image_spec(spec), scratch)
        os.makedirs(scratch + "/dev", mode=0o755, exist_ok=True)  # the devices go in when a container takes it
        os.chmod(scratch + "/dev", 0o755)
        os.mkdir(scratch + SLOTS, 0o711)
        source = os.open(scratch, _DIRECTORY)
        try:
            for slot in range(slots):
                os.mkdir(f"{scratch}{SLOTS}/{slot}", 0o700)
                target = os.open(f"{scratch}{SLOTS}/{slot}", _DIRECTORY)
                try:
                    materialized.clone(source, target, skipped=(CELLS.lstrip("/"), SLOTS.lstrip("/"), "tmp"))
                    os.fchmod(target, stat.S_IMODE(os.fstat(source).st_mode))
                finally:
                    os.close(target)
        finally:
            os.close(source)
        os.rename(scratch, path)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return path, True


def find(spec: dict, image_dir: str) -> str:
    """The image tree for spec, "" if the image has none (another layer, another interpreter)."""
    if not image_dir:
        return ""
    path = os.path.join(image_dir, image_key(spec))
    return path if os.path.isdir(path + SLOTS) else ""


def is_image_tree(root: str) -> bool:
    return os.path.isdir(root + SLOTS)


def holds_alike(path: str, spec: dict, added: dict | None = None) -> bool:
    """Whether the image tree at path, taken by this process, holds the generated files spec wants (a runtime's
    later zygote may want others: its runs' resolvers changed) and the additions added (another layer)."""
    return _finished.get(path) == dict(spec.get("generated", {})) and _added.get(path) == additions_key(added)


def additions(spec: dict, base: dict) -> dict | None:
    """What spec's tree holds beyond base's (its layer-less spec), as a spec of its own: the binds and the placed
    entries base lacks. None where spec differs from base otherwise (other hidden paths or devices, a bind base has
    and spec lacks, a placed entry of base's from another source): base's tree cannot be made spec's by adding."""
    if sorted(spec["hidden"]) != sorted(base["hidden"]) or sorted(spec["devices"]) != sorted(base["devices"]):
        return None
    if spec.get("tmp_replaced", True) != base.get("tmp_replaced", True):
        return None
    placed, base_placed = spec.get("placed", {}), base.get("placed", {})
    if any(bind not in spec["binds"] for bind in base["binds"]):
        return None
    if any(placed.get(target) != source for target, source in base_placed.items()):
        return None
    return {
        "binds": [bind for bind in spec["binds"] if bind not in base["binds"]],
        "hidden": list(spec["hidden"]),  # what base hides stays hidden in what is added
        "placed": {target: source for target, source in placed.items() if target not in base_placed},
        "generated": {},
        "devices": [],
        "tmp_replaced": spec.get("tmp_replaced", True),
    }


def additions_key(added: dict | None) -> str:
    """The key of what added adds (materialized.fingerprint: its sources' stats included: a layer rebuilt gives
    another), NO_ADDITIONS for nothing."""
    if not added or not (added["binds"] or added["placed"]):
        return NO_ADDITIONS
    return "added-" + materialized.fingerprint(added, device_nodes=False)


def take(path: str, spec: dict, device_nodes: bool, added: dict | None = None, uncache: bool = False) -> int | None:
    """A descriptor holding a shared lock on the image tree at path, its generated files and devices written as
    spec and this container want them, and what added adds (additions(): none if None) in it and in every slot;
    None where another instance holds it with other ones (the caller builds a tree of its own instead).
    uncache: the pages of the added files' sources dropped as they are copied (tree_store.TreeStore.uncache); the
    copies' go with the tree's, once its first zygotes have read them (provisions.py)."""
    wanted = additions_key(added)
    fd = os.open(path, _DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fcntl.flock(fd, fcntl.LOCK_SH)  # another instance of this container has it: it must hold the same
            if not _holds(path, spec, device_nodes) or _read_added(path)["key"] != wanted:
                os.close(fd)
                return None
        else:  # no live instance holds it: the cells it has were given by dead ones
            finish(path, spec, device_nodes)
            _finished[path] = dict(spec.get("generated", {}))
            replaced = _read_added(path)["key"] != wanted
            if replaced:
                _add(path, added, wanted, uncache)
            # every slot free again, and made again as this instance's: a uid a dead instance gave one may be another
            # live instance's by now (the dead one's block, given to an instance started since), whose runs this one
            # must never take a slot from; and a uid of this one's would find the dead one's generated files there
            cells = path + CELLS
            for name in os.listdir(cells):
                if name.isdigit() and os.path.islink(f"{cells}/{name}"):
                    os.unlink(f"{cells}/{name}")
                elif replaced and name.isdigit():  # a cell made beyond the slots: a clone of the old additions
                    removal.remove(f"{cells}/{name}")
            for slot in os.listdir(path + SLOTS):
                if slot.isdigit():
                    removal.remove(f"{path}{SLOTS}/{slot}/tmp")  # a dead run's (its cell's name went above)
                    _prepare(path, f"{path}{SLOTS}/{slot}")
            _assigned[path] = set()
            _release_slots(path)
            fcntl.flock(fd, fcntl.LOCK_SH)
        _finished[path] = dict(spec.get("generated", {}))
        _added[path] = wanted
        return fd
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise


def finish(path: str, spec: dict, device_nodes: bool) -> None:
    """Write into the image tree at path what an image leaves out: the generated files (root's, 0444) and the
    devices (nodes, or stand-ins: materialized.materialize)."""
    for target, text in spec.get("generated", {}).items():
        _write(path + target, text)
    for name in os.listdir(path + CELLS):
        if name.startswith(LINKING):  # a cell's symlink a killed instance left half-made: no uid's
            os.unlink(os.path.join(path + CELLS, name))
    devices = path + "/dev"
    for name in os.listdir(devices):
        os.unlink(os.path.join(devices, name))
    for device in spec["devices"]:
        target = path + device
        if device_nodes:
            os.mknod(target, stat.S_IFCHR | 0o666, os.stat(device).st_rdev)
            os.chmod(target, 0o666)  # mknod's mode goes through the umask
        elif device == materialized.NULL_STAND_IN:
            _write(target, "")


def _add(path: str, added: dict | None, wanted: str, uncache: bool) -> None:
    """Make the image tree at path hold what added adds (the additions key wanted) and no earlier additions, and
    no slot of it any earlier additions (each gets these when it is first given: _fill). Called under the exclusive
    take only: no live instance uses the tree or a slot.

    What is added is materialized beside the tree (its directory's filesystem: a rename moves it in), then each
    top-most entry the tree lacks is moved into it. The record beside the tree names those entries before any is
    moved in, its key set only once all are in place: a container killed halfway leaves a record whose key matches
    nothing, and the next take removes them, from the tree and from every slot."""
    record = _read_added(path)
    image_dir, name = os.path.split(path)
    for left in os.listdir(image_dir):  # what an instance killed while adding left beside the tree
        if left.startswith((f"{name}{ADDED}-", f"{name}{ADDED}.")):
            removal.remove(os.path.join(image_dir, left))
    slots = [f"{path}{SLOTS}/{slot}" for slot in os.listdir(path + SLOTS) if slot.isdigit()]
    # a kill while they go leaves a record that matches nothing and still names them (not one that says they are
    # whole, and which slots hold them: a start that wants them again would give a slot they are gone from)
    _write_added(path, "", record["entries"])
    for entry in record["entries"]:  # the old additions go, from every slot and from the tree
        for root in [*slots, path]:
            removal.remove(root + entry)
    _write_added(path, "", [])
    if wanted == NO_ADDITIONS:
        _write_added(path, NO_ADDITIONS, [])
        return
    assert added is not None
    for target in added["placed"]:
        if os.path.lexists(path + target):  # a placed entry shows over what a bind put there: not an addition
            raise OSError(errno.EEXIST, f"{target} is in the image's tree already: the layer cannot be added to it")
    started = time.monotonic()
    scratch = f"{path}{ADDED}-{time.time_ns()}"
    os.mkdir(scratch, 0o700)
    try:
        done = materialized.materialize(added, scratch, device_nodes=False, uncache=uncache)
        entries = _new_entries(scratch, path)
        # the copies on disk before the record says they are complete. Their pages stay cached: the runtime's first
        # zygotes and runs read them now; once they have, the pages no process maps are dropped with the tree's
        # (provisions.py: _forget_tree_pages)
        syscalls.syncfs(scratch)
        _write_added(path, "", entries)
        for entry in entries:
            os.rename(scratch + entry, path + entry)
        _write_added(path, wanted, entries)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    log.info(
        "tree %s: the image's layer-less tree, %d entries added (%d files linked, %d copied, %d bytes) in %.2f s; "
        "linked into its %d slots as the first runs take them, and into the rest once those are served",
        path,
        len(entries),
        done.linked,
        done.copied,
        done.copied_bytes,
        time.monotonic() - started,
        len(slots),
    )


_NOT_ADDED = (CELLS.lstrip("/"), SLOTS.lstrip("/"), "tmp", "dev")  # the tree's own, never an addition's


def _new_entries(scratch: str, tree: str) -> list[str]:
    """The top-most entries under scratch that tree lacks (paths from the root); what both hold is the same host
    path mirrored (a file bound twice, a symlink on the way, a directory both have: looked into)."""
    found: list[str] = []
    pending = [""]
    while pending:
        directory = pending.pop()
        with os.scandir(scratch + directory) as entries:
            for entry in entries:
                name = f"{directory}/{entry.name}"
                if not directory and entry.name in _NOT_ADDED:
                    continue
                try:
                    info = os.lstat(tree + name)
                except FileNotFoundError:
                    found.append(name)
                    continue
                if entry.is_dir(follow_symlinks=False) and stat.S_ISDIR(info.st_mode):
                    pending.append(name)
    return sorted(found)


def _fill(root: str, slot: str, record: dict | None = None) -> bool:
    """The tree's additions hard-linked into one of its slots, about to be given (assign_slot, under the cells'
    lock: one instance at a time), unless the record says the slot holds them all already; what a fill killed
    halfway left goes first. False where the record is not the additions this instance took (the slot is not
    given: a cell of the container's own clones the tree instead). record: the one just read under that lock."""
    record = record or _read_added(root)
    if record["key"] != _added.get(root, NO_ADDITIONS):
        return False
    if slot in record["slots"] or not record["entries"]:
        return True
    target = f"{root}{SLOTS}/{slot}"
    for entry in record["entries"]:
        removal.remove(target + entry)
        _link_into(root + entry, target + entry)
    _write_added(root, record["key"], record["entries"], [*record["slots"], slot])
    return True


def fill_slots(root: str) -> int:
    """Every slot of the image tree at root that lacks the tree's additions gets them now (_fill), one at a time
    under the cells' lock; how many did. Once done, giving a slot links nothing: no run sees the added files' link
    count and change time move when another uid's run first takes a slot (which would tell it when other tenants'
    runs began, and how many went on at once). The runtime calls it once its first runs are served (provisions.py),
    so that the start's first runs do not wait for 16 slots' links."""
    filled = 0
    for slot in sorted((name for name in os.listdir(root + SLOTS) if name.isdigit()), key=int):
        held = os.open(root + CELLS, _DIRECTORY)
        try:
            fcntl.flock(held, fcntl.LOCK_EX)  # no slot given meanwhile, by this instance or another
            record = _read_added(root)
            if record["entries"] and slot not in record["slots"] and _fill(root, slot, record):
                filled += 1
        finally:
            os.close(held)
    return filled


def _link_into(source: str, target: str) -> None:
    """An added entry of the tree into a slot: a directory made again (root's, its mode), its files hard links."""
    info = os.lstat(source)
    if not stat.S_ISDIR(info.st_mode):
        os.link(source, target, follow_symlinks=False)
        return
    os.mkdir(target, 0o700)
    inner_source, inner_target = os.open(source, _DIRECTORY), os.open(target, _DIRECTORY)
    try:
        materialized.clone(inner_source, inner_target)
        os.fchmod(inner_target, stat.S_IMODE(info.st_mode))
    finally:
        os.close(inner_source)
        os.close(inner_target)


def _read_added(path: str) -> dict:
    """The record beside the image tree at path: the key of what was added, its entries (none as built), and the
    slots that hold them all."""
    try:
        with open(path + ADDED) as file:
            record = json.load(file)
        if not isinstance(record["entries"], list) or not isinstance(record.get("slots", []), list):
            raise TypeError("entries, slots: lists")
        entries = [str(entry) for entry in record["entries"]]
        for entry in entries:  # each removed with its slots' copies when replaced: a path inside the tree, no more
            parts = entry.split("/")
            if parts[0] != "" or len(parts) < 2 or {"", ".", ".."} & set(parts[1:]) or parts[1] in _NOT_ADDED:
                raise ValueError(entry)
        slots = [str(slot) for slot in record.get("slots", [])]
        if not all(slot.isdigit() for slot in slots):
            raise ValueError(slots)
        return {"key": str(record["key"]), "entries": entries, "slots": slots}
    except FileNotFoundError:
        return {"key": NO_ADDITIONS, "entries": [], "slots": []}
    except (OSError, ValueError, KeyError, TypeError):  # unreadable: its entries unknown, the tree not trusted
        raise OSError(errno.EINVAL, f"{path}{ADDED} cannot be read: the image's tree is not used") from None


def _write_added(path: str, key: str, entries: list[str], slots: list[str] | None = None) -> None:
    scratch = f"{path}{ADDED}.{time.time_ns()}"
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with open(fd, "w") as file:
        json.dump({"key": key, "entries": entries, "slots": slots or []}, file)
        file.flush()
        os.fsync(file.fileno())
    os.rename(scratch, path + ADDED)


def _holds(path: str, spec: dict, device_nodes: bool) -> bool:
    try:
        for target, text in spec.get("generated", {}).items():
            with open(path + target) as file:
                if file.read() != text:
                    return False
        shown = sorted(os.listdir(path + "/dev"))
    except OSError:
        return False
    wanted = [os.path.basename(d) for d in spec["devices"] if device_nodes or d == materialized.NULL_STAND_IN]
    return shown == sorted(wanted)


def _write(path: str, text: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444)
    with open(fd, "w") as file:
        file.write(text)
    os.chmod(path, 0o444)  # whatever the umask


def assign_slot(root: str, uid: int) -> bool:
    """uid's cell in the image tree at root: a slot no other uid has (or one whose uid has no child in it and is
    this instance's, or was a gone instance's), its devices and generated files made as the tree's, and
    `cells/<uid>` naming it; False if every slot is in use. The caller holds tree_store's cell locks (no cell made,
    no run's /tmp made meanwhile)."""
    cells, slots = root + CELLS, root + SLOTS
    held = os.open(cells, _DIRECTORY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)  # another instance of this container gives slots too: one at a time
        taken: dict[str, str] = {}  # slot -> the name (a uid's) of the cell it is
        for name in os.listdir(cells):
            with contextlib.suppress(OSError):
                taken[os.path.basename(os.readlink(os.path.join(cells, name)))] = name
        unnamed = sorted((n for n in os.listdir(slots) if n.isdigit() and n not in taken), key=int)
        free = next(([n] for n in unnamed if _hold_slot(root, n)), [])  # no cell names it: nobody's, held now
        mine = _assigned.setdefault(root, set())
        if not free:
            for slot, name in sorted(taken.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else -1):
                idle = not os.path.lexists(f"{slots}/{slot}/tmp")  # no child of its uid is in it
                if not idle or not name.isdigit() or name == str(uid):
                    continue
                # this instance's own uid's, or a gone instance's (no live one holds its lock): never a live one's
                if (int(name) in mine and slot in _slot_locks.get(root, {})) or _hold_slot(root, slot):
                    os.unlink(os.path.join(cells, name))  # its uid has no child in it: it makes its cell again
                    materialized.forget_devices(os.path.join(cells, name))
                    mine.discard(int(name))
                    free = [slot]
                    break
        if not free:
            return False
        slot = free[0]
        _prepare(root, f"{slots}/{slot}")
        if not _fill(root, slot):
            _release_slot(root, slot)
            return False
        link = os.path.join(cells, f"{LINKING}{uid}-{time.time_ns()}")
        os.symlink(f"..{SLOTS}/{slot}", link)
        try:
            os.rename(link, os.path.join(cells, str(uid)))
        except OSError as exc:
            os.unlink(link)
            _release_slot(root, slot)
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR):
                raise
            return True  # the uid has a cell already
        mine.add(uid)
        return True
    finally:
        os.close(held)


def adopt_slot(root: str, uid: int) -> None:
    """uid's cell in the image tree at root is a slot another instance gave (one that is gone: uids are one
    instance's at a time): its lock is this instance's from now on, so that no other instance gives it away while
    this one's runs use it. Nothing where the cell is this instance's already, or not a slot."""
    cell = f"{root}{CELLS}/{uid}"
    try:
        slot = os.path.basename(os.readlink(cell))
    except OSError:
        return
    if slot in _slot_locks.get(root, {}):
        return
    held = os.open(root + CELLS, _DIRECTORY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)  # not while another instance gives slots
        with contextlib.suppress(OSError):
            if os.path.basename(os.readlink(cell)) == slot and _hold_slot(root, slot):
                _assigned.setdefault(root, set()).add(uid)
    finally:
        os.close(held)


def _hold_slot(root: str, slot: str) -> bool:
    """This instance's lock on a slot of the tree at root: True if it holds it now (or did), False if a live
    instance does."""
    locks = _slot_locks.setdefault(root, {})
    if slot in locks:
        return True
    fd = os.open(f"{root}{SLOTS}/{slot}", _DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    locks[slot] = fd
    return True


def _release_slot(root: str, slot: str) -> None:
    fd = _slot_locks.get(root, {}).pop(slot, None)
    if fd is not None:
        os.close(fd)


def _release_slots(root: str) -> None:
    for slot in list(_slot_locks.get(root, {})):
        _release_slot(root, slot)


def _prepare(root: str, slot: str) -> None:
    """A slot as a cell of the tree at root: its devices and generated files made again, as the tree's."""
    devices = slot + "/dev"
    models = {name: os.lstat(os.path.join(root, "dev", name)) for name in os.listdir(root + "/dev")}
    kept = set()
    for name in os.listdir(devices):
        model, info = models.get(name), os.lstat(os.path.join(devices, name))
        if model is not None and not stat.S_ISCHR(model.st_mode) and info.st_ino == model.st_ino:
            kept.add(name)  # the stand-in, linked already: linked again, its change time would tell every run
            continue  # when a slot changed hands (a run cannot write or touch it: nothing of one run's is in it)
        os.unlink(os.path.join(devices, name))
    for name, model in models.items():
        target = os.path.join(devices, name)
        if name in kept:
            continue
        if stat.S_ISCHR(model.st_mode):
            os.mknod(target, stat.S_IFCHR | 0o666, model.st_rdev)
            os.chmod(target, 0o666)
        else:
            os.link(os.path.join(root, "dev", name), target)  # a stand-in: a file nobody may write
    for target in _finished.get(root, ()):
        try:
            if os.lstat(slot + target).st_ino == os.lstat(root + target).st_ino:
                continue  # linked already: linked again, its change time would tell every run when a slot changed hands
            os.unlink(slot + target)
        except FileNotFoundError:
            pass
        os.link(root + target, slot + target)
