"""The chroot jail's hostile corpus (tests/test_hostile.py, tests/test_container.py) against the landlock jail.

A whole service as nobody under the restricted pod's stand-in (tests/test_landlock_mode.py), and every case
of the corpus that applies where runs share the service's uid. Left out, each for its reason: a literal /tmp
(the run's directory is named by TMPDIR; a refused write to /tmp says so: test_landlock_tmp), the root jail's
shape and a uid per run (runs share the service's uid by design), the capability sets of the children of a uid
block (there is no block; the service itself holds no capability).
"""

from __future__ import annotations

import pytest
import test_container
import test_hostile
import unprivileged
from test_landlock_mode import KERNEL_ABI, RESTRICTED_POD

APPLICABLE = [
    "test_memory_bomb_bytearray",
    "test_memory_bomb_growing_list",
    "test_memory_limit_extension_is_honoured",
    "test_process_creation_fails",
    "test_os_system_command_never_runs",
    "test_threads_keep_working",
    "test_output_flood_stops_at_the_cap",
    "test_sigterm_ignoring_code_dies_at_its_timeout",
    "test_cpu_time_does_not_pre_empt_the_wall_clock",
    "test_no_signals_or_ptrace_to_the_service",
    "test_environment_holds_no_secret",
    "test_only_stdio_descriptors_are_open",
    "test_a_forged_exit_report_only_ends_its_own_run",
    "test_a_signal_a_run_sends_itself_ends_it",
    "test_a_run_that_handles_its_own_signal_goes_on",
    "test_zygote_environment_is_clean",
    "test_service_survives_a_burst_of_hostile_runs",
    "test_ipc_objects_cannot_be_made",
    "test_no_socket_but_plain_tcp_udp_and_unix_pairs",
    "test_a_run_cannot_change_the_shared_files",
]
for _name in APPLICABLE:
    globals()[_name] = getattr(test_hostile, _name)

CONTAINER_CORPUS = [
    "test_every_shared_case_in_a_default_container",
    "test_python_in_the_chroot_jail",
    "test_nodejs_in_the_chroot_jail",
]
for _name in CONTAINER_CORPUS:
    globals()[_name] = getattr(test_container, _name)


# cases whose expectation is the chroot tree's shape, not a protection: where it differs here, and why
OTHER_SHAPE = {
    "kill(1, 15)": "pid 1 is the run's own only in a PID namespace; here the signal fence refuses it (EPERM)",
    "py-etc-passwd": "the host's /etc/passwd is there but refused (EACCES), not missing (ENOENT): Landlock does "
    "not hide names, it refuses opening them (test_landlock_mode: test_names_show_contents_do_not)",
    "a literal /tmp of its own": "the run's directory is the runtime's, under the host's /tmp (TMPDIR names it): "
    "no mount or chroot can show it as /tmp here, and a refused write there says where to write (test_landlock_tmp)",
    "nothing of the host is visible": "names of the host's files can be stat()ed (Landlock checks no stat): "
    "their contents are refused (test_names_show_contents_do_not)",
    "no second chroot, no way out through a directory descriptor": "no tree to break out of: / is the host's, "
    "readable only where the domain allows",
    "no root, its own /tmp": "its /tmp is the directory TMPDIR names, not /tmp",
}


@pytest.fixture(autouse=True)
def _other_shape(request):
    for key, why in OTHER_SHAPE.items():
        if key in request.node.name:
            pytest.skip(why)


@pytest.fixture(scope="module")
def service():
    if unprivileged.unavailable():
        pytest.skip(unprivileged.unavailable())
    if KERNEL_ABI < 1:
        pytest.skip("needs Landlock")
    svc = unprivileged.service()
    svc.user = None
    svc.launcher = RESTRICTED_POD
    svc.start()
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def container(service):
    return service
