"""What a runtime reports of itself (/health, `sandlot status`): its state, and what each run gets in its mode."""

from __future__ import annotations

import logging
import socket
from typing import TYPE_CHECKING

from runtimes.jail import modes
from runtimes.jail.policy import landlock_mode, network_access
from runtimes.jail.policy.tree_files import RUN_HOSTNAME
from runtimes.linux import syscalls

log = logging.getLogger("sandlot.runtime")

if TYPE_CHECKING:
    from runtimes.config import RuntimeConfig
    from runtimes.jail.service.runtime import JailedRuntime
    from runtimes.linux.protections import Protections


def no_seccomp(why: str) -> str:
    return f"the seccomp filter cannot be installed here: {why or 'refused'}"


def refuse_unless_jailed(config: RuntimeConfig, platform: Protections, mode: modes.Mode) -> None:
    """Raises modes.JailRefused where the settings ask for what this platform or mode cannot give."""
    if config.require_seccomp and not platform.seccomp:
        raise modes.JailRefused(no_seccomp(platform.errors.get("seccomp", "")))
    if mode.narrow_domain and not config.require_seccomp:
        raise modes.JailRefused(landlock_mode.needs_seccomp(platform.landlock))


def log_left_out(language: str, kind: str, report: dict, last: dict[str, dict]) -> None:
    """What a new zygote of that kind could not preload: logged once, not at every rotation (last: by kind)."""
    left_out = report.get("preload_failed") or {}
    if left_out and left_out != last.get(kind):
        log.warning("%s: left out of the preload: %s", language, left_out)
    last[kind] = left_out


def status(runtime: JailedRuntime) -> dict:
    report = runtime.report
    provisions = runtime.provisions
    return {
        "ready": runtime.ready,
        "starting": starting(runtime),
        "installed": not runtime.missing(),
        "error": runtime.error,
        "protections": protections(runtime),
        "platform": runtime.platform.to_dict() if runtime.platform else None,
        "preloaded": report.get("preloaded", []),
        "preload_failed": report.get("preload_failed", {}),
        "huge_pages": report.get("huge_pages", 0),  # of the zygote's warm heap (jail/zygote/warmheap.py)
        # the uid block as this platform's user namespace map allows it (jail/service/uids.py)
        "uids": provisions.uid_status() if provisions else None,
        **(runtime.pool.status() if runtime.pool else {}),
        **(runtime.schedule.status() if runtime.schedule else {"ready_children": 0}),
    }


def protections(runtime: JailedRuntime) -> dict:
    """What each run gets in this runtime's mode (README: protections per run)."""
    mode, platform, provisions = runtime.mode, runtime.platform, runtime.provisions
    if mode is None:
        return {"mode": ""}
    report = runtime.report
    abi = platform.landlock if platform else 0
    run_network = runtime.run_network
    return {
        "mode": mode.name,
        "fresh_process": True,
        "seccomp": bool(report.get("seccomp")),
        "tree": mode.tree,  # what a run sees as /: the read-only tree (pivot or chroot), or the platform's
        "chroot": mode.tree != modes.NO_TREE,
        "own_uid": mode.own_uid,
        "user_namespace": mode.identity == modes.USER_NAMESPACE,
        "pid_namespace": mode.pid_namespace,  # the run is pid 1: its processes die with it; none other is named
        "processes_ended_by": mode.processes,
        "capabilities": "none",
        "private_tmp": mode.tmp,
        "landlock": abi,
        **(landlock_mode.health(abi) if mode.narrow_domain else {}),
        "time_namespace": bool(report.get("time_namespace")),  # clocks from zero: no host uptime
        **hostname(mode, platform),
        "rlimits": True,
        "scrubbed_environment": True,
        "egress_filter": bool(provisions and provisions.egress_in_force),
        # the runs' own (userns without root)
        "network_namespace": bool(provisions and provisions.own_network_namespace),
        "network_refused": run_network.message if run_network.kind == network_access.REFUSED else "",
        **run_network.health(),  # what runs asking for network get: filtered, none, unfiltered, refused
    }


def run_hostname(mode: modes.Mode | None, platform: Protections | None) -> str:
    """What uname() tells a run: RUN_HOSTNAME in a UTS namespace of its own; where it has none (chroot),
    this machine's (a container's) own name, which the run's hosts file then knows too, as the name
    a run may look up (nothing uname() does not tell it already)."""
    if mode is not None and not mode.clone_flags & syscalls.CLONE_NEWUTS:
        return socket.gethostname()
    if platform is not None and not platform.hostname:
        return socket.gethostname()  # sethostname refused: the UTS namespace keeps the container's name
    return RUN_HOSTNAME


def hostname(mode: modes.Mode | None, platform: Protections | None) -> dict:
    """What uname() tells a run: a name of its own, or where sethostname is refused (podman's profile
    without CAP_SYS_ADMIN) the container's, the step dropped as cosmetic."""
    if mode is None or not mode.clone_flags & syscalls.CLONE_NEWUTS:
        return {"hostname": "the container's", "hostname_reason": "no UTS namespace in this mode"}
    if platform is not None and not platform.hostname:
        why = platform.errors.get("hostname", "refused")
        return {"hostname": "the container's", "hostname_reason": f"sethostname refused ({why}): step dropped"}
    return {"hostname": RUN_HOSTNAME, "hostname_reason": ""}


FAILING_AFTER = 3  # children failed in a row, none confined since: runs fail, the runtime is not ready


def ready(runtime: JailedRuntime) -> bool:
    """A run can be served: the zygote serves, and (served many at once) a child has been fully confined,
    and children are not failing one after another."""
    return (
        runtime.started
        and runtime.schedule is not None
        and runtime.pool.running
        and not runtime.refused
        and not children_failing(runtime)
    )


def children_failing(runtime: JailedRuntime) -> str:
    """Why children cannot be had now, or ""."""
    pool = runtime.pool
    if pool is None:
        return ""
    if pool.failed_in_a_row >= FAILING_AFTER or (pool.spawn_error and not pool.confined):
        return pool.spawn_error
    if not pool.confined and not runtime.config.one_run_at_a_time:  # the serial schedule forks at a run
        return "no child confined yet"
    return ""


def starting(runtime: JailedRuntime) -> bool:
    """Not ready yet, and nothing has failed: its zygotes or its first child are on their way (a normal start,
    logged at INFO once ready; a failure is logged at ERROR)."""
    if runtime.ready or runtime.refused:
        return False
    pool = runtime.pool
    if pool is None:
        return not runtime.started  # started without a pool: it failed before its first zygote
    return not (pool.last_error or pool.spawn_error or pool.failed_in_a_row)


def error(runtime: JailedRuntime) -> str:
    """Why runs cannot be served now, or ""."""
    if runtime.refused:
        return runtime.refused
    if runtime.pool is None or not runtime.started:
        return "starting"
    if not runtime.pool.running:
        return runtime.pool.last_error or "the zygote is down"
    return children_failing(runtime)
