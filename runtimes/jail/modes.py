"""Which jail a runtime uses, chosen from the probed protections record and SANDLOT_JAIL.

- `full`: root. Each run has a uid of its own from the instance's block, a PID,
  mount and IPC namespace of its own (its first process, an init that waits for
  the run, takes every process of the namespace with it when it ends), the
  read-only tree, a capped noexec tmpfs /tmp, no capabilities, Landlock.
- `userns`: no root needed (and, as root, the zygote drops to a uid of the block
  before any child exists). Each run has a user namespace of its own with PID,
  mount and IPC namespaces inside it, the same tree and /tmp, every capability
  given up, Landlock (filesystem, no TCP bind, signals and abstract unix sockets
  kept inside the run). Runs share one uid; what separates them is that no run
  can name, reach or open another process: separate PID namespaces, no /proc,
  non-dumpable, Landlock scopes, seccomp.
- `single`: no identity or namespace of the run's own at all (AWS Lambda). Only
  with `RuntimeConfig.one_run_at_a_time`: one run at a time, and nothing of it
  left before the next.

SANDLOT_JAIL: `auto` (full as root, else userns, else single when one run at a
time, else refuse), `full`, `userns` (`reduced` is its older name), `single`.
A mode the platform cannot give is refused with the reason, never weakened.
"""

from __future__ import annotations

from runtimes.jail.protections import Protections

FULL = "full"
USERNS = "userns"
SINGLE = "single"
TREE_MODES = (FULL, USERNS)  # modes whose runs see only the read-only tree
ALIASES = {"reduced": USERNS}
CHOICES = ("auto", FULL, USERNS, SINGLE, *ALIASES)


class JailRefused(RuntimeError):
    """This platform cannot give the jail asked for: runs are refused, and this says why."""


def _missing(record: Protections, names: tuple[str, ...]) -> list[str]:
    missing = []
    for name in names:
        if not getattr(record, name):
            why = record.errors.get(name, "not available")
            missing.append(f"{name} ({why})")
    return missing


FULL_NEEDS = ("setuid", "chroot", "mount_namespaces", "pid_namespaces", "pdeathsig", "no_new_privs")
USERNS_NEEDS = ("user_namespaces", "mount_namespaces", "pid_namespaces", "pdeathsig", "no_new_privs")


def select(requested: str, record: Protections, one_run_at_a_time: bool) -> str:
    """The mode to use, or JailRefused saying why none can serve."""
    requested = ALIASES.get(requested, requested)
    if requested not in CHOICES:
        raise JailRefused(f"unknown SANDLOT_JAIL value {requested!r}: one of {', '.join(CHOICES)}")
    if requested == FULL:
        missing = _missing(record, FULL_NEEDS) if record.euid == 0 else ["root"]
        if missing:
            needs = ", ".join(FULL_NEEDS)
            raise JailRefused(f"SANDLOT_JAIL=full needs root with {needs}; missing: {'; '.join(missing)}")
        return FULL
    if requested == USERNS:
        missing = _missing(record, USERNS_NEEDS)
        if missing:
            raise JailRefused(f"SANDLOT_JAIL=userns needs {', '.join(USERNS_NEEDS)}; missing: {'; '.join(missing)}")
        return USERNS
    if requested == SINGLE:
        if record.euid == 0:
            raise JailRefused("SANDLOT_JAIL=single as root would run user code as root: use full or userns")
        if not one_run_at_a_time:
            raise JailRefused(
                "SANDLOT_JAIL=single gives runs no identity or namespace of their own: it may only serve "
                "one run at a time (a Lambda function), never many tenants at once"
            )
        return SINGLE
    if record.euid == 0 and not _missing(record, FULL_NEEDS):
        return FULL
    if not _missing(record, USERNS_NEEDS):
        return USERNS
    if one_run_at_a_time and record.euid != 0:
        return SINGLE
    raise JailRefused(
        "no jail that keeps tenants apart is possible here: neither root "
        f"({'; '.join(_missing(record, FULL_NEEDS)) or 'not root'}) nor user namespaces "
        f"({'; '.join(_missing(record, USERNS_NEEDS))}); refusing to serve many tenants with nothing between them"
    )
