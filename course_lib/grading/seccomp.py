"""The system calls a sandbox may not make: a seccomp filter that bubblewrap loads (``--seccomp FD``).

No cgroup bounds a sandbox here (the grader uses none: on most machines it would need a delegated
cgroup v2 subtree of its own), so what a cgroup would count and the watch cannot see is closed
at the door instead:

- memory outside every process's resident set: ``memfd_create``, System V shared memory and
  message queues, POSIX message queues, ``io_uring``, ``userfaultfd`` and sockets (no network
  either way; their buffers are kernel memory).  What stays open is bounded elsewhere: ``/tmp``
  and ``/dev/shm`` are tmpfs with a size, pipes are few (``RLIMIT_NOFILE``) and small;
- ``setsid``: the sandbox is one session, so the kernel's per-session CPU scheduling
  (autogroup) gives it one share however many processes it starts;
- the kernel's key management (``add_key``, ``request_key``, ``keyctl``): a key would outlive
  the sandbox in the keyring of its uid, which a later sandbox reuses;
- new namespaces and mounts (``unshare``, ``clone`` with a ``CLONE_NEW*`` flag, ``setns``, the
  mount calls), where a process could mount a tmpfs of no size or leave its session;
  ``clone3`` says ENOSYS, so the C library falls back to ``clone``, whose flags are read;
- ``bpf`` and ``perf_event_open``.

A denied call fails with EPERM (the answer sees a ``PermissionError``); a call of another ABI
(32-bit x86, x32) ends the process.  The filter is classic BPF, written out for x86_64 and
aarch64 (``NUMBERS``); elsewhere the sandbox does not start.
"""
from __future__ import annotations

import errno
import os
import platform
import struct

DENIED = ("memfd_create", "shmget", "msgget", "mq_open", "io_uring_setup", "userfaultfd", "socket", "socketpair",
          "setsid", "add_key", "request_key", "keyctl", "unshare", "setns", "mount", "umount2", "pivot_root",
          "open_tree", "move_mount", "fsopen", "fsmount", "bpf", "perf_event_open")

# (audit architecture, {name: number}) from the kernel's unistd headers
NUMBERS = {
    "x86_64": (0xC000003E, dict(
        memfd_create=319, shmget=29, msgget=68, mq_open=240, io_uring_setup=425, userfaultfd=323, socket=41,
        socketpair=53, setsid=112, add_key=248, request_key=249, keyctl=250, unshare=272, setns=308, mount=165,
        umount2=166, pivot_root=155, open_tree=428, move_mount=429, fsopen=430, fsmount=432, bpf=321,
        perf_event_open=298, clone=56, clone3=435)),
    "aarch64": (0xC00000B7, dict(
        memfd_create=279, shmget=194, msgget=186, mq_open=180, io_uring_setup=425, userfaultfd=282, socket=198,
        socketpair=199, setsid=157, add_key=217, request_key=218, keyctl=219, unshare=97, setns=268, mount=40,
        umount2=39, pivot_root=41, open_tree=428, move_mount=429, fsopen=430, fsmount=432, bpf=280,
        perf_event_open=241, clone=220, clone3=435)),
}
CLONE_NEW = 0x7E020000   # CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET (NEWTIME: unshare only)
X32_BIT = 0x40000000     # x86_64's x32 ABI: the same numbers with this bit set

_LOAD, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
ALLOW, KILL, ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_NR, _ARCH, _ARG0 = 0, 4, 16   # offsets in struct seccomp_data (arg 0's low 32 bits on little-endian machines)


def machine() -> str:
    return platform.machine().lower().replace("arm64", "aarch64").replace("amd64", "x86_64")


def supported() -> bool:
    return machine() in NUMBERS


def program() -> bytes:
    """The filter for this machine, as the ``struct sock_filter`` array bubblewrap reads."""
    arch, numbers = NUMBERS[machine()]
    ops = [(_LOAD, 0, 0, _ARCH), (_JEQ, 1, 0, arch), (_RET, 0, 0, KILL), (_LOAD, 0, 0, _NR)]
    if machine() == "x86_64":
        ops += [(_JGE, 0, 1, X32_BIT), (_RET, 0, 0, KILL)]
    for name in DENIED:
        ops += [(_JEQ, 0, 1, numbers[name]), (_RET, 0, 0, ERRNO | errno.EPERM)]
    ops += [(_JEQ, 0, 1, numbers["clone3"]), (_RET, 0, 0, ERRNO | errno.ENOSYS),
            (_JEQ, 1, 0, numbers["clone"]), (_RET, 0, 0, ALLOW),
            (_LOAD, 0, 0, _ARG0), (_JSET, 0, 1, CLONE_NEW), (_RET, 0, 0, ERRNO | errno.EPERM), (_RET, 0, 0, ALLOW)]
    return b"".join(struct.pack("=HBBI", *op) for op in ops)


def program_fd() -> int:
    """A file descriptor to read the filter from (a pipe, filled and closed for writing), for ``--seccomp``."""
    data = program()
    read, write = os.pipe()
    try:
        os.write(write, data)   # a few hundred bytes: well under a pipe's buffer
    finally:
        os.close(write)
    return read
