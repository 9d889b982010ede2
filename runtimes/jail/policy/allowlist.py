"""The seccomp allow-lists, built with libseccomp through pyseccomp.

A filter is built per language and network mode. Anything not listed fails with
EPERM, so user code sees "Operation not permitted" instead of dying silently.
Process creation is refused: fork and vfork fail with EPERM, clone only passes
with CLONE_THREAD and CLONE_FILES (threads keep working), clone3 answers ENOSYS so that glibc
falls back to clone. execve is only admitted where a runtime must exec its own
interpreter (Node), and stays admitted for the run, which gains nothing by it: the
filter, the uid and the limits outlive an exec. (Where /tmp is a directory of the
host's disk, the chroot mode and Lambda, a Node run could write a program there and
exec it, as it could load native code with process.dlopen: either way, code that is
held by the same filter as the run's JavaScript.)

Nothing a run may call shows it the host or another run. With network a run may
open TCP and UDP sockets over IPv4 and IPv6 and connect them, nothing else: no
bind, listen or accept (nothing reaches it), no unix socket but socketpair (no
abstract socket of the host or another run), no netlink (no view of the host's
sockets or interfaces), no raw socket, no socket buffer sized past the default.
No ioctl but the terminals' and descriptors' ('T'): none of the socket range
(interfaces, routes, a socket's namespace), none of a filesystem's (the host
disk's map of free extents, its uuid). Calls that take a pid take 0 (the
caller) only; kill and friends are fenced to the run's own pid by fence_for.
Locks are the run's own: flock and fcntl record locks succeed without taking a
lock, since a run is one process and its lock could only be seen by another run
(on a shared read-only file: the layer, /etc/hosts, /dev/null).

Nor can a run reach another through the page cache of the shared read-only tree
or through machine-wide counters: no call that evicts a file's pages for everyone
(fadvise64 POSIX_FADV_DONTNEED; madvise MADV_PAGEOUT, which the kernel honours on
files the caller owns, as the service's uid owns its layer without root, and
MADV_COLD), none that tells whether a page is cached (preadv2/pwritev2 with
RWF_NOWAIT, mincore, cachestat), no KSM merging (MADV_MERGEABLE: merged pages
are a timing channel between runs), no sysinfo (the process count, load and free
memory of the whole machine), no statfs or fstatfs (a filesystem's size and free
blocks and inodes: where a run's /tmp is a directory of the host's disk, the
chroot mode, its free inodes are a counter every run can move and read; a tmpfs's
default size and inode count are a fraction of the machine's memory). What
remains is timing: README, "What remains".

Nor does a run read the host's clocks past its time namespace: times() answers
ENOSYS (its return value counts clock ticks since the host booted, which no time
namespace shifts; neither Python's nor Node's start calls it, and os.times()
raises OSError).
"""

from __future__ import annotations

import errno
import struct
from typing import TYPE_CHECKING

from runtimes.linux import seccomp as engine
from runtimes.linux.libseccomp import pyseccomp
from runtimes.linux.seccomp import compile_program as compile_program  # re-exported: the zygote, tests
from runtimes.linux.syscalls import SeccompProgram

if TYPE_CHECKING:
    from runtimes.jail.zygote_config import RunnerConfig

CLONE_THREAD = 0x00010000
CLONE_FILES = 0x00000400
CLOSE_RANGE_UNSHARE = 1 << 1
AF_UNIX = 1
AF_INET = 2
AF_INET6 = 10
SOCK_STREAM = 1
SOCK_DGRAM = 2
SOCK_TYPE_MASK = 0xF  # the rest of socket()'s type argument is SOCK_NONBLOCK and SOCK_CLOEXEC
IPPROTO_TCP = 6
IPPROTO_UDP = 17

# What any interpreter needs to run code that computes, reads its tree and
# writes to its pipes and its own /tmp.
BASE_SYSCALLS = (
    # files and descriptors
    "read",
    "write",
    "readv",
    "writev",
    "pread64",
    "pwrite64",
    "preadv",
    "pwritev",
    "lseek",
    "close",
    "open",
    "openat",
    "openat2",
    "stat",
    "fstat",
    "lstat",
    "newfstatat",
    "statx",
    "access",
    "faccessat",
    "faccessat2",
    "readlink",
    "readlinkat",
    "getdents",
    "getdents64",
    "getcwd",
    "chdir",
    "fchdir",
    "mkdir",
    "mkdirat",
    "rmdir",
    "unlink",
    "unlinkat",
    "rename",
    "renameat",
    "renameat2",
    "link",
    "linkat",
    "symlink",
    "symlinkat",
    "chmod",
    "fchmod",
    "fchmodat",
    "umask",
    "utimensat",
    "utime",
    "utimes",
    "futimesat",
    "truncate",
    "ftruncate",
    "fsync",
    "fdatasync",
    "dup",
    "dup2",
    "dup3",
    "pipe",
    "pipe2",
    "sendfile",
    "copy_file_range",
    "getxattr",
    "lgetxattr",
    "fgetxattr",
    # memory
    "mmap",
    "munmap",
    "mprotect",
    "mremap",
    "brk",
    "msync",
    "membarrier",
    # signals and time
    "rt_sigaction",
    "rt_sigprocmask",
    "rt_sigreturn",
    "rt_sigpending",
    "rt_sigtimedwait",
    "rt_sigsuspend",
    "sigaltstack",
    "pause",
    "alarm",
    "setitimer",
    "getitimer",
    "timer_create",
    "timer_settime",
    "timer_gettime",
    "timer_getoverrun",
    "timer_delete",
    "nanosleep",
    "clock_nanosleep",
    "clock_gettime",
    "clock_getres",
    "gettimeofday",
    "time",
    # identity and limits (read-only views)
    "getpid",
    "getppid",
    "gettid",
    "getuid",
    "geteuid",
    "getgid",
    "getegid",
    "getresuid",
    "getresgid",
    "getgroups",
    "getpgrp",
    "getrlimit",
    "getrusage",
    "uname",
    "sched_yield",
    "sched_get_priority_max",
    "sched_get_priority_min",
    # threads
    "futex",
    "set_robust_list",
    "set_tid_address",
    "rseq",
    "arch_prctl",
    "exit",
    "exit_group",
    "wait4",
    "waitid",
    # waiting on descriptors
    "select",
    "pselect6",
    "poll",
    "ppoll",
    "epoll_create",
    "epoll_create1",
    "epoll_ctl",
    "epoll_wait",
    "epoll_pwait",
    "epoll_pwait2",
    "eventfd",
    "eventfd2",
    "timerfd_create",
    "timerfd_settime",
    "timerfd_gettime",
    "signalfd",
    "signalfd4",
    "getrandom",
    # I/O on sockets that already exist (socketpair; network sockets when allowed)
    "sendto",
    "recvfrom",
    "sendmsg",
    "recvmsg",
    "sendmmsg",
    "recvmmsg",
    "shutdown",
    "getsockopt",
    "getsockname",
    "getpeername",
)

# The calls of the list that some architectures lack, each with the calls a libc uses there for the same thing,
# all in the list too. aarch64, like every architecture younger than x86_64, has only the generic table, without
# these; libseccomp drops a name its architecture lacks without a word, so each is declared here and
# tests/test_seccomp_arches.py proves, for x86_64 and aarch64, that every name of the list resolves or is one of
# these with its stand-ins resolving in its place.
LEGACY_CALLS = {
    "open": ("openat",),
    "stat": ("newfstatat", "statx"),
    "lstat": ("newfstatat", "statx"),
    "access": ("faccessat", "faccessat2"),
    "readlink": ("readlinkat",),
    "getdents": ("getdents64",),
    "mkdir": ("mkdirat",),
    "rmdir": ("unlinkat",),
    "unlink": ("unlinkat",),
    "rename": ("renameat", "renameat2"),
    "link": ("linkat",),
    "symlink": ("symlinkat",),
    "chmod": ("fchmodat",),
    "utime": ("utimensat",),
    "utimes": ("utimensat",),
    "futimesat": ("utimensat",),
    "dup2": ("dup3",),
    "pipe": ("pipe2",),
    "pause": ("rt_sigsuspend", "ppoll"),
    "alarm": ("setitimer",),
    "time": ("clock_gettime", "gettimeofday"),
    "getpgrp": ("getpgid",),  # getpgid(0), the caller's: SELF_ONLY
    "select": ("pselect6",),
    "poll": ("ppoll",),
    "epoll_create": ("epoll_create1",),
    "epoll_wait": ("epoll_pwait",),
    "eventfd": ("eventfd2",),
    "signalfd": ("signalfd4",),
    # x86's own: its thread pointer is set by a call (ARCH_SET_FS); aarch64's is a register (tpidr_el0) the
    # thread writes itself, so nothing stands in for it
    "arch_prctl": (),
}

# Advice that touches only the run's own mappings or reads ahead: everything madvise offers but
# MADV_MERGEABLE (12, KSM), MADV_COLD (20) and MADV_PAGEOUT (21), which push shared file pages
# towards eviction, MADV_COLLAPSE (25), which rewrites a shared file's cached pages, and the
# hardware-poisoning ones (100, 101). As (mask, value) pairs on the advice's 32 bits.
MADVISE_ALLOWED = (
    (0xFFFFFFFC, 0),  # NORMAL, RANDOM, SEQUENTIAL, WILLNEED
    (0xFFFFFFFF, 4),  # DONTNEED: drops the caller's own page-table entries (malloc needs it)
    (0xFFFFFFFC, 8),  # FREE, REMOVE, DONTFORK, DOFORK
    (0xFFFFFFFF, 13),  # UNMERGEABLE
    (0xFFFFFFFE, 14),  # HUGEPAGE, NOHUGEPAGE
    (0xFFFFFFFC, 16),  # DONTDUMP, DODUMP, WIPEONFORK, KEEPONFORK
    (0xFFFFFFFE, 22),  # POPULATE_READ, POPULATE_WRITE
    (0xFFFFFFFF, 24),  # DONTNEED_LOCKED
    (0xFFFFFFFE, 102),  # GUARD_INSTALL, GUARD_REMOVE
)
# fadvise64's advice: NORMAL, RANDOM, SEQUENTIAL, WILLNEED (a read ahead: what reading does) and
# NOREUSE; not DONTNEED (4), which drops a file's cached pages for every reader of it.
FADVISE_ALLOWED = ((0xFFFFFFFC, 0), (0xFFFFFFFF, 5))
RWF_NOWAIT = 0x8  # preadv2/pwritev2: fail instead of waiting for the disk, so "is this page cached?"
RWF_FLAGS_ARG = 5  # (fd, iov, iovcnt, pos_l, pos_h, flags)

# setsockopt: the levels of the sockets a run can have (socket level; IP, TCP, UDP, IPv6). The socket-level
# options that size a socket's buffers are answered with success and not applied (the kernel clamps them
# silently anyway): raised to net.core.wmem_max, a run's few hundred sockets could pin gigabytes of kernel
# memory that no rlimit counts; at the default size they hold about 100 MiB at most.
SOL_SOCKET = 1
SOCKET_OPTION_LEVELS = (0, 6, 17, 41)  # besides SOL_SOCKET: SOL_IP, SOL_TCP, SOL_UDP, SOL_IPV6
SOCKET_BUFFER_OPTIONS = (7, 8, 32, 33)  # SO_SNDBUF, SO_RCVBUF, SO_SNDBUFFORCE, SO_RCVBUFFORCE
SOCKET_OPTIONS_BELOW = 128  # Linux's socket-level options are numbered below this


# With network: a client's calls. No bind, listen or accept: nothing reaches a run from outside.
# refused where runs share files that the kernel lets anyone hard-link (build's refuse_links)
LINK_CALLS = ("link", "linkat")
NETWORK_SYSCALLS = ("connect",)
NETWORK_FAMILIES = (AF_INET, AF_INET6)
# socket()'s protocol for each type: 0 (the type's default) or the type's own. Never another: MPTCP (262) is a
# SOCK_STREAM socket that Landlock's TCP port rules do not see, UDP-Lite (136) a SOCK_DGRAM one, SCTP (132) either
NETWORK_TYPES = {SOCK_STREAM: (0, IPPROTO_TCP), SOCK_DGRAM: (0, IPPROTO_UDP)}

# Calls that name a process: a run may only name itself (0), so that "no such process"
# and "not permitted" cannot tell it which pids exist. (argument index of the pid)
SELF_ONLY = {
    "getpgid": 0,
    "getsid": 0,
    "sched_getaffinity": 0,
    "sched_getparam": 0,
    "sched_getscheduler": 0,
    "get_robust_list": 0,
    "prlimit64": 0,
    "getpriority": 1,  # (which, who): who 0 is the caller, its process group or its uid
}

# fcntl commands a run may use, by number (glibc's names); record locks are answered below.
FCNTL_ALLOWED = (
    0,  # F_DUPFD
    1,  # F_GETFD
    2,  # F_SETFD
    3,  # F_GETFL
    4,  # F_SETFL
    5,  # F_GETLK
    9,  # F_GETOWN
    11,  # F_GETSIG
    16,  # F_GETOWN_EX
    36,  # F_OFD_GETLK
    1025,  # F_GETLEASE
    1030,  # F_DUPFD_CLOEXEC
    1032,  # F_GETPIPE_SZ
    1033,  # F_ADD_SEALS
    1034,  # F_GET_SEALS
)
FCNTL_LOCKS = (6, 7, 37, 38)  # F_SETLK, F_SETLKW, F_OFD_SETLK, F_OFD_SETLKW: succeed, lock nothing
# F_SETPIPE_SZ up to the default size only (16 pages), refused above with the kernel's own EPERM (what an
# unprivileged caller gets past fs.pipe-max-size). Pipe pages are counted per uid (fs.pipe-user-pages-soft,
# 16384 pages): past it, new pipes get 2 pages, which any run of the same uid reads with F_GETPIPE_SZ. Runs
# that share a uid (no root) passed 8 bits in 8 s so, one run growing 127 pipes to 1 MiB; at the default size
# its 256 descriptors hold 2,032 pages at most.
F_SETPIPE_SZ = 1031
# fallocate's mode: 0 only, which allocates and grows the file (bounded by RLIMIT_FSIZE, as a write is).
# FALLOC_FL_KEEP_SIZE allocates past the size, where RLIMIT_FSIZE does not look (a run held 1 GiB past a
# 64 MiB /tmp cap in the chroot mode), and the other modes (punching, zeroing, collapsing, inserting
# ranges) need it or move blocks about: EOPNOTSUPP, as on a filesystem without them (posix_fallocate
# then writes zeros, as there).
FALLOCATE_MODE_ARG = 1
PIPE_DEFAULT_BYTES = 65536
# ioctl commands carry a type byte (bits 8-15). Only type 'T' (0x54) is allowed: terminals' (TCGETS for
# isatty, TIOCGWINSZ) and the generic descriptor ones (FIONREAD, FIONBIO, FIOCLEX, FIONCLEX, FIOASYNC,
# FIOQSIZE), tested on bits 8-15 only, which the kernel reads whatever the upper bits say. Every other type
# fails: the socket range 0x89 (SIOCGIFCONF lists interfaces from any socket, socketpair included; SIOCGSKNS
# opens the network namespace), the wireless one, and the filesystems' ('X', 'f', 0x15, 0x94...: on a file
# of the host's disk, FS_IOC_GETFSMAP maps the whole disk's free extents and FS_IOC_FIEMAP tells where the
# allocator works, a counter other runs' writes move; FS_IOC_GETFSUUID names the disk).
IOCTL_ALLOWED_TYPES = ((0xFF00, 0x5400),)

# ALLOWED_SYSCALLS may add to the list, never these: process creation, exec,
# tracing, mounts, namespaces and the like stay closed whatever the operator says.
NEVER_ALLOWED = frozenset(
    {
        "fork",
        "vfork",
        "clone",
        "clone3",
        "execve",
        "execveat",
        "ptrace",
        "process_vm_readv",
        "process_vm_writev",
        "mount",
        "umount2",
        "pivot_root",
        "chroot",
        "unshare",
        "setns",
        "move_mount",
        "open_tree",
        "fsopen",
        "fsmount",
        "fsconfig",
        "fspick",
        "mount_setattr",
        "kexec_load",
        "kexec_file_load",
        "init_module",
        "finit_module",
        "delete_module",
        "bpf",
        "perf_event_open",
        "userfaultfd",
        "seccomp",
        "setuid",
        "setgid",
        "setreuid",
        "setregid",
        "setresuid",
        "setresgid",
        "setgroups",
        "setfsuid",
        "setfsgid",
        "capset",
        "reboot",
        "swapon",
        "swapoff",
        "keyctl",
        "add_key",
        "request_key",
        "pidfd_open",
        "pidfd_getfd",
        "pidfd_send_signal",
        "kcmp",
        # what the jail closes by arguments: an unconditional rule would lift the condition
        "socket",
        "socketcall",
        "socketpair",
        "bind",
        "listen",
        "accept",
        "accept4",
        "ioctl",
        "fcntl",
        "flock",
        "madvise",
        "fadvise64",
        "preadv2",
        "pwritev2",
        "kill",
        "tgkill",
        "tkill",
        "rt_sigqueueinfo",
        "rt_tgsigqueueinfo",
        *SELF_ONLY,
        # shared kernel objects that outlive a run or cross runs
        "sysinfo",  # machine-wide counters: two runs pass bytes through the process count
        "mincore",  # whether a file's pages are cached, for files the caller owns
        "cachestat",  # the same, for any file it can read
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
        "memfd_create",
        "memfd_secret",
        "shmget",
        "shmat",
        "shmdt",
        "shmctl",
        "semget",
        "semop",
        "semtimedop",
        "semctl",
        "msgget",
        "msgsnd",
        "msgrcv",
        "msgctl",
        "mq_open",
        "mq_unlink",
        "mq_timedsend",
        "mq_timedreceive",
        "mq_notify",
        "mq_getsetattr",
        "inotify_init",
        "inotify_init1",
        "inotify_add_watch",
        "fanotify_init",
        "fanotify_mark",
        "name_to_handle_at",
        "open_by_handle_at",
        "process_madvise",
        "personality",
        "setpriority",
        "sched_setaffinity",
        "sched_setscheduler",
        "sched_setparam",
        "ioprio_set",
        "ioprio_get",
        "migrate_pages",
        "move_pages",
        "syslog",
        "acct",
        "quotactl",
        "iopl",
        "ioperm",
        "sethostname",
        "setdomainname",
        "settimeofday",
        "times",  # clock ticks since the host booted: no time namespace shifts them (answered ENOSYS)
        "clock_settime",
        "clock_adjtime",
        "adjtimex",
        "mknod",
        "mknodat",
    }
)


def extra_syscall_names(numbers: list[int] | tuple[int, ...], arch: int | None = None) -> dict[int, str]:
    """An operator's ALLOWED_SYSCALLS, read as the numbers of the architecture the runs execute on (this
    machine's unless arch says: a number is a different call on x86_64 and on aarch64, 57 fork on one and close
    on the other), by name; ValueError for one that is no call there, or one that would reopen what must stay
    closed, named."""
    names = {}
    where = engine.arch_name(arch)
    for number in numbers:
        try:
            name = engine.syscall_name(number, arch)
        except Exception as exc:  # libseccomp does not know it
            raise ValueError(f"ALLOWED_SYSCALLS: {number} is not a system call on this machine ({where})") from exc
        if name in NEVER_ALLOWED:
            raise ValueError(
                f"ALLOWED_SYSCALLS: {number} ({name} on {where}) may not be allowed: it would reopen what the jail "
                "closes"
            )
        names[number] = name
    return names


def check_extra_syscalls(numbers: list[int], arch: int | None = None) -> None:
    """Refuse an operator's ALLOWED_SYSCALLS that would reopen what must stay closed."""
    extra_syscall_names(numbers, arch)


def build(
    network: bool,
    extra: tuple[int, ...] = (),
    allow_exec: bool = False,
    arch: int | None = None,
    refuse_links: bool = False,
) -> pyseccomp.SyscallFilter:
    """The allow-list for one run. Build once per process, load in each child. arch: for another architecture
    than this machine's (what the tests read of aarch64's program on x86_64); extra is that architecture's.
    refuse_links: link and linkat fail with EPERM, as the kernel's fs.protected_hardlinks would answer a link to a
    shared file (language.links_refused says where)."""
    # checked here too, whoever built the config (a Lambda's environment too); added by the name the number has on
    # the filter's architecture (libseccomp reads a rule's number as this machine's and translates it)
    extra_names = extra_syscall_names(extra, arch)
    flt = engine.for_arch(pyseccomp.SyscallFilter(pyseccomp.ERRNO(errno.EPERM)), arch)
    try:  # a binary tree instead of a linear list: every system call of a run pays for the lookup
        flt.set_attr(pyseccomp.Attr.CTL_OPTIMIZE, 2)
    except OSError:
        pass  # libseccomp older than 2.5
    for name in BASE_SYSCALLS:
        if not (refuse_links and name in LINK_CALLS):
            engine.allow(flt, name)
    for name in extra_names.values():
        if not (refuse_links and name in LINK_CALLS):
            flt.add_rule(pyseccomp.ALLOW, name)
    if refuse_links:
        for name in LINK_CALLS:
            engine.refuse(flt, errno.EPERM, name)
    # threads share one descriptor table (pthread_create's flags), which the service reads for files a run holds
    # after their names went (tmp/held.py): no thread of a table of its own, by clone or by close_range
    thread = CLONE_THREAD | CLONE_FILES
    engine.allow(flt, "clone", pyseccomp.Arg(0, pyseccomp.MASKED_EQ, thread, thread))
    engine.allow(flt, "close_range", pyseccomp.Arg(2, pyseccomp.MASKED_EQ, CLOSE_RANGE_UNSHARE, 0))
    flt.add_rule(pyseccomp.ERRNO(errno.ENOSYS), "clone3")
    engine.refuse(flt, errno.ENOSYS, "times")  # as on a kernel without it: callers must handle that
    engine.allow(flt, "socketpair", pyseccomp.Arg(0, pyseccomp.EQ, AF_UNIX))
    for name, index in SELF_ONLY.items():
        engine.allow(flt, name, pyseccomp.Arg(index, pyseccomp.EQ, 0))
    for command in FCNTL_ALLOWED:
        engine.allow(flt, "fcntl", pyseccomp.Arg(1, pyseccomp.MASKED_EQ, 0xFFFFFFFF, command))
    for command in FCNTL_LOCKS:
        flt.add_rule(pyseccomp.ERRNO(0), "fcntl", pyseccomp.Arg(1, pyseccomp.MASKED_EQ, 0xFFFFFFFF, command))
    engine.allow(flt, "fallocate", pyseccomp.Arg(FALLOCATE_MODE_ARG, pyseccomp.MASKED_EQ, 0xFFFFFFFF, 0))
    for mask, value in engine.all_but({0}, 1 << 32):  # every other mode, on the int's 32 bits the kernel reads
        flt.add_rule(
            pyseccomp.ERRNO(errno.EOPNOTSUPP),
            "fallocate",
            pyseccomp.Arg(FALLOCATE_MODE_ARG, pyseccomp.MASKED_EQ, mask, value),
        )
    pipe_size = pyseccomp.Arg(1, pyseccomp.MASKED_EQ, 0xFFFFFFFF, F_SETPIPE_SZ)
    for mask, value in ((0xFFFF0000, 0), (0xFFFFFFFF, PIPE_DEFAULT_BYTES)):  # the kernel reads an unsigned int
        engine.allow(flt, "fcntl", pipe_size, pyseccomp.Arg(2, pyseccomp.MASKED_EQ, mask, value))
    flt.add_rule(pyseccomp.ERRNO(0), "flock")
    for level in SOCKET_OPTION_LEVELS:
        engine.allow(flt, "setsockopt", pyseccomp.Arg(1, pyseccomp.MASKED_EQ, 0xFFFFFFFF, level))
    socket_level = pyseccomp.Arg(1, pyseccomp.MASKED_EQ, 0xFFFFFFFF, SOL_SOCKET)
    for mask, value in engine.all_but(set(SOCKET_BUFFER_OPTIONS), SOCKET_OPTIONS_BELOW):
        engine.allow(flt, "setsockopt", socket_level, pyseccomp.Arg(2, pyseccomp.MASKED_EQ, mask, value))
    for option in SOCKET_BUFFER_OPTIONS:
        flt.add_rule(
            pyseccomp.ERRNO(0), "setsockopt", socket_level, pyseccomp.Arg(2, pyseccomp.MASKED_EQ, 0xFFFFFFFF, option)
        )
    for mask, value in IOCTL_ALLOWED_TYPES:
        engine.allow(flt, "ioctl", pyseccomp.Arg(1, pyseccomp.MASKED_EQ, mask, value))
    for mask, value in MADVISE_ALLOWED:
        engine.allow(flt, "madvise", pyseccomp.Arg(2, pyseccomp.MASKED_EQ, mask, value))
    for mask, value in FADVISE_ALLOWED:
        engine.allow(flt, "fadvise64", pyseccomp.Arg(3, pyseccomp.MASKED_EQ, mask, value))
    # RWF_NOWAIT answers as on a file that cannot do it: callers must handle that anyway
    for name in ("preadv2", "pwritev2"):
        engine.allow(flt, name, pyseccomp.Arg(RWF_FLAGS_ARG, pyseccomp.MASKED_EQ, RWF_NOWAIT, 0))
        flt.add_rule(
            pyseccomp.ERRNO(errno.EOPNOTSUPP),
            name,
            pyseccomp.Arg(RWF_FLAGS_ARG, pyseccomp.MASKED_EQ, RWF_NOWAIT, RWF_NOWAIT),
        )
    # kill, tgkill and tkill: allowed here, narrowed to the run's own pid by fence_for
    for name in ("kill", "tgkill", "tkill"):
        engine.allow(flt, name)
    if network:
        for family in NETWORK_FAMILIES:
            for kind, protocols in NETWORK_TYPES.items():
                for protocol in protocols:
                    engine.allow(
                        flt,
                        "socket",
                        pyseccomp.Arg(0, pyseccomp.EQ, family),
                        pyseccomp.Arg(1, pyseccomp.MASKED_EQ, SOCK_TYPE_MASK, kind),
                        pyseccomp.Arg(2, pyseccomp.MASKED_EQ, 0xFFFFFFFF, protocol),
                    )
        for name in NETWORK_SYSCALLS:
            engine.allow(flt, name)
    if allow_exec:
        engine.allow(flt, "execve")
    return flt


def fence_for(pid: int, arch: int | None = None) -> pyseccomp.SyscallFilter:
    """Every child: signals and limits for itself only.

    The kernel lets a process signal, or set the limits of, any other process of its
    uid: the service and the zygote included, where runs share the service's uid; with
    a uid of its own, "not permitted" against "no such process" still tells a run which
    pids exist. Stacked under the allow-list, this refuses kill, tgkill and tkill aimed
    anywhere but at pid (process groups too), and prlimit64 on any process but the
    caller (pid 0). A child loads fence_program(its pid).
    """
    flt = engine.for_arch(pyseccomp.SyscallFilter(pyseccomp.ALLOW), arch)
    refuse = pyseccomp.ERRNO(errno.EPERM)
    for name in ("kill", "tgkill", "tkill"):  # unsigned comparisons: negative pids are above pid
        flt.add_rule(refuse, name, pyseccomp.Arg(0, pyseccomp.GT, pid))
        flt.add_rule(refuse, name, pyseccomp.Arg(0, pyseccomp.LT, pid))
    flt.add_rule(refuse, "prlimit64", pyseccomp.Arg(0, pyseccomp.NE, 0))
    return flt


# A pid no process can have (above the largest pid_max, 2**22): the fence is compiled once
# for it, and each child's copy has it replaced by the child's pid (see fence_program).
_FENCE_PLACEHOLDER = 0x7A5A5A01
_fence_template: list = []  # [program bytes, offsets of the placeholder's k fields, (arch, clock call numbers)]


def fence_program(pid: int) -> SeccompProgram:
    """fence_for(pid), compiled, behind clock_prefix(pid): libseccomp's program for a placeholder
    pid with the placeholder replaced, a copy instead of a build in every child (a build costs
    about a millisecond more). The zygote compiles the template in programs()."""
    if not _fence_template:
        bpf = engine.export(fence_for(_FENCE_PLACEHOLDER))
        insns = struct.iter_unpack(engine.INSN, bpf)
        offsets = [i * 8 + 4 for i, (_code, _jt, _jf, k) in enumerate(insns) if k == _FENCE_PLACEHOLDER]
        _fence_template.extend((bpf, offsets, _clock_calls()))
    bpf, offsets, clock_calls = _fence_template
    program = bytearray(bpf)
    for offset in offsets:
        struct.pack_into("I", program, offset, pid)
    return SeccompProgram(clock_prefix(pid, clock_calls) + bytes(program))


# The calls that take a clock id as their first argument and accept a CPU clock's (timerfd_create takes the
# system clocks only). Linux encodes a CPU clock as (~pid << 3) | type: type 0-2 the process's (PROF, VIRT,
# SCHED), with 4 added a thread's, 3 a descriptor's clock (CLOCKFD); pid 0 is the caller. The kernel reads
# the CPU time of any process of the machine for whoever names it: in the chroot mode, with no PID
# namespace, that is every other run, the zygotes and the service, and two runs passed a byte a second
# through it.
CLOCK_CALLS = ("clock_gettime", "clock_getres", "clock_nanosleep", "timer_create")
SYSTEM_CLOCKS = 12  # CLOCK_REALTIME (0) to CLOCK_TAI (11)
CPU_CLOCK_TYPES = (0, 1, 2, 4, 5, 6)  # a process's and a thread's PROF, VIRT, SCHED; not 3 or 7 (CLOCKFD)


def _clock_calls(arch: int | None = None) -> tuple[int, tuple[int, ...]]:
    """(an architecture's audit arch, this machine's by default, and the numbers of CLOCK_CALLS there, resolved
    by name by libseccomp: never one architecture's numbers on another)."""
    arch = engine.native_arch() if arch is None else arch
    numbers = (engine.syscall_number(name, arch) for name in CLOCK_CALLS)
    return arch, tuple(number for number in numbers if number is not None)


def clock_prefix(pid: int, calls: tuple[int, tuple[int, ...]] | None = None) -> bytes:
    """A few BPF instructions run before the fence: CLOCK_CALLS take only the system clocks (0 to 11) and the
    CPU clocks of the caller, named by pid 0 (-8 to -2, but CLOCKFD's -5) or by its own pid (the main thread's
    tid is the pid); any other clock id answers EINVAL, as a pid that does not exist would. The first
    argument is an int: only its lower 32 bits are tested, all the kernel reads (glibc's syscall passes a
    negative id sign-extended, the vDSO's fallback zero-extended). Other calls go on to the fence's program,
    which follows. Hand-written because libseccomp takes one test per argument in a rule, and this one needs
    a range and the pid's encoding. Its first test is the architecture's, as libseccomp's programs' is: a call
    made under another one (an x86_64 process's int 0x80, the i386 table) kills the process, since the numbers
    it compares mean other calls there. The other threads of a run have their CPU clock as
    CLOCK_THREAD_CPUTIME_ID (or pid 0) only: pthread_getcpuclockid() of a thread but the first gives an id
    this refuses."""
    arch, numbers = calls or _clock_calls()
    own = (~pid << 3) & 0xFFFFFFFF  # the process's PROF clock; the others follow it
    refuse, allow = "refuse", "allow"
    code: list[tuple] = [
        (engine.LD_ABS, 0, 0, engine.DATA_ARCH),
        (engine.JEQ, 1, 0, arch),
        (engine.RET, 0, 0, engine.RET_KILL_PROCESS),
        (engine.LD_ABS, 0, 0, engine.DATA_NR),
    ]
    for i, number in enumerate(numbers):
        code.append((engine.JEQ, "check", "next" if i == len(numbers) - 1 else 0, number))
    low = engine.DATA_ARG0 if engine.LITTLE_ENDIAN else engine.DATA_ARG0 + 4  # the int the kernel reads
    code += [
        ("check",),
        (engine.LD_ABS, 0, 0, low),
        (engine.JGT, 0, allow, SYSTEM_CLOCKS - 1),
        (engine.JGE, "self", 0, 0xFFFFFFF8),  # pid 0: -8 to -1
        (engine.SUB, 0, 0, own),  # its own pid: own + type, with type in CPU_CLOCK_TYPES
        (engine.JGT, refuse, 0, max(CPU_CLOCK_TYPES)),
        (engine.JEQ, refuse, allow, 3),
        ("self",),
        (engine.JEQ, refuse, 0, 0xFFFFFFFB),
        (engine.JEQ, refuse, allow, 0xFFFFFFFF),
        ("allow",),
        (engine.RET, 0, 0, engine.RET_ALLOW),
        ("refuse",),
        (engine.RET, 0, 0, engine.RET_ERRNO | errno.EINVAL),
        ("next",),
    ]
    return engine.assemble(code)


def programs(
    extra: tuple[int, ...] = (), allow_exec: bool = False, refuse_links: bool = False
) -> dict[bool, SeccompProgram]:
    """The compiled filters of a runtime, by network flag (and the fence's template, for its children)."""
    fence_program(_FENCE_PLACEHOLDER)
    return {
        network: compile_program(build(network, extra, allow_exec, refuse_links=refuse_links))
        for network in (False, True)
    }


def prepared(config: RunnerConfig, allow_exec: bool = False) -> tuple[dict[bool, SeccompProgram], str | None]:
    """A runner's filters by network flag, checked to load here, and why not (None when they do).

    config.seccomp false: the platform's record found seccomp refused, and nothing of libseccomp is
    touched (it asks the kernel through seccomp() what it supports, and some platforms kill a caller of a
    refused call with SIGSYS).
    """
    if not config.seccomp:
        return {}, "refused by the platform (the protections record)"
    filters = programs(tuple(config.extra_syscalls), allow_exec=allow_exec, refuse_links=config.refuse_links)
    error = engine.probe(filters[False])
    return (filters if error is None else {}), error


# ---- The landlock mode: what Landlock leaves to seccomp where runs share the service's uid ----------------
# (runtimes/jail/policy/landlock_mode.py). Kept apart from the allow-list above: stacked on it in that mode only.

CHMOD_BY_PATH = ("chmod", "fchmodat", "fchmodat2")
F_SETPIPE_SZ = 1031
UTIME_BY_PATH = ("utime", "utimes", "futimesat")
# a file's times, owner and extended attributes through a descriptor (or any way at all): the allow-list admits
# utimensat (futimens) for every mode, and none of the others, which an operator's ALLOWED_SYSCALLS could add;
# here they are refused whatever that says. fchmod is answered apart (FCHMOD_ANSWER).
METADATA_ANY_WAY = (
    "utimensat",
    "chown",
    "fchown",
    "lchown",
    "fchownat",
    "setxattr",
    "lsetxattr",
    "fsetxattr",
    "setxattrat",
    "removexattr",
    "lremovexattr",
    "fremovexattr",
    "removexattrat",
)
# a directory the run makes keeps its owner's read and search bits (the service, of the same uid and no
# capability, must list it to count it against the /tmp cap and to remove it): mkdir's mode must hold them, and
# the umask may not take them away (mode & ~umask is what the directory gets)
OWNER_LISTS = 0o500  # S_IRUSR | S_IXUSR
# fchmod succeeds and changes nothing: libuv's copyfile (Node's fs.copyFile, fs.cp) sets the copy's mode through
# its descriptor and fails the copy on any error, although the copy already has the source's mode from its open
# (O_CREAT with that mode); a seccomp filter cannot tell the run's own copy from a shared file, so no descriptor
# gets its mode changed, and the copy works
FCHMOD_ANSWER = 0
MKDIR_MODE_ARG = {"mkdir": 1, "mkdirat": 2}
LANDLOCK_TRUNCATE_ABI = 3  # LANDLOCK_ACCESS_FS_TRUNCATE
LANDLOCK_SCOPES_ABI = 6  # LANDLOCK_SCOPE_SIGNAL, LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET


def shared_uid_rules(abi: int) -> pyseccomp.SyscallFilter:
    """What a run sharing the service's uid must not do that its Landlock domain (ABI abi) does not refuse.

    Pipes keep their default size (F_SETPIPE_SZ refused): their buffers count against the uid's, shared with the
    service and every other run. Landlock has no right for a file's mode, times, owner or extended attributes,
    at any ABI, and every file a run can open is its uid's (the layer, the Node wrapper, the snapshot: the
    service made them): chmod and utime are refused by path and through a descriptor alike (futimens and
    utimensat in every form, AT_EMPTY_PATH included, fchmodat2 too), as are chown and setxattr in every form
    (the allow-list has none of them; restated here against ALLOWED_SYSCALLS); fchmod succeeds and changes
    nothing (FCHMOD_ANSWER). A seccomp filter sees no path, so a run's own files in its /tmp are held the same
    way (docs/security.md says why).
    A directory it makes keeps its owner's read and search bits (mkdir's mode without them, or a umask that
    masks them, is refused): the service lists it to count and remove it.
    Below ABI 3 it does not check truncate by path either: refused (ftruncate needs a descriptor opened for
    writing, which the domain checks). Below ABI 6 it has no scopes: kill, tgkill and tkill stay fenced to the
    run's own pid by fence_for, which every child loads; any AF_UNIX socket but socketpair (an abstract socket
    of the service or of another run) is refused here too, besides the allow-list's own refusal of it.
    """
    flt = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    try:  # a binary tree, as the allow-list's: every system call of a run passes this filter too
        flt.set_attr(pyseccomp.Attr.CTL_OPTIMIZE, 2)
    except OSError:
        pass  # libseccomp older than 2.5
    refuse = pyseccomp.ERRNO(errno.EPERM)
    for name in (*CHMOD_BY_PATH, *UTIME_BY_PATH, *METADATA_ANY_WAY):
        try:
            flt.add_rule(refuse, name)
        except (ValueError, OSError):
            pass  # not a system call on this architecture (or unknown to this libseccomp: fchmodat2)
    flt.add_rule(pyseccomp.ERRNO(FCHMOD_ANSWER), "fchmod")
    for name, index in MKDIR_MODE_ARG.items():
        for lacking in (0, 0o100, 0o400):  # the mode's owner r and x bits, one or both missing
            try:
                flt.add_rule(refuse, name, pyseccomp.Arg(index, pyseccomp.MASKED_EQ, OWNER_LISTS, lacking))
            except (ValueError, OSError):
                pass  # no mkdir on this architecture (arm64: mkdirat only)
    for masked in (0o100, 0o400, 0o500):
        flt.add_rule(refuse, "umask", pyseccomp.Arg(0, pyseccomp.MASKED_EQ, OWNER_LISTS, masked))
    # pipe buffers are counted per uid (fs.pipe-user-pages-soft, 64 MiB): one run growing its pipes to 1 MiB
    # each reaches it alone, and then every new pipe of the uid, the service's and other runs', gets 8 KiB
    flt.add_rule(refuse, "fcntl", pyseccomp.Arg(1, pyseccomp.MASKED_EQ, 0xFFFFFFFF, F_SETPIPE_SZ))
    if abi < LANDLOCK_TRUNCATE_ABI:
        flt.add_rule(refuse, "truncate")
    if abi < LANDLOCK_SCOPES_ABI:
        flt.add_rule(refuse, "socket", pyseccomp.Arg(0, pyseccomp.EQ, AF_UNIX))
    return flt
