"""The seccomp filter every sandboxed command runs under: kernel interfaces it has no use for fail.

bubblewrap installs it (``--seccomp FD``, a compiled classic-BPF program) in the sandbox's first
process, right before the exec; everything the command forks inherits it and cannot remove it.
A denied system call fails with ``EPERM``, as under Docker's default profile. Denied (``DENIED``):

- loading or replacing kernel code: ``init_module``, ``finit_module``, ``delete_module``,
  ``kexec_load``, ``kexec_file_load``, ``bpf``, ``reboot``, ``swapon``/``swapoff``, ``acct``;
- mounting and namespaces: ``mount``, ``umount2``, ``pivot_root``, the new mount API
  (``fsopen``, ``fsconfig``, ``fsmount``, ``fspick``, ``open_tree``, ``move_mount``,
  ``mount_setattr``), ``unshare``, ``setns``;
- kernel surfaces with a long record of privilege-escalation bugs: ``io_uring_*``,
  ``userfaultfd``, ``perf_event_open``, the keyring (``add_key``, ``request_key``, ``keyctl``),
  ``open_by_handle_at``/``name_to_handle_at``, ``fanotify_init``;
- other processes' memory and state: ``ptrace``, ``process_vm_readv``/``process_vm_writev``,
  ``kcmp``;
- the host's clock, quotas and log: ``settimeofday``, ``clock_settime``, ``clock_adjtime``,
  ``quotactl``, ``quotactl_fd``, ``syslog``; x86-64 also ``iopl``, ``ioperm``, ``uselib``,
  ``ustat``, ``sysfs``, ``_sysctl``, ``lookup_dcookie``.

A call made through another ABI than the machine's own (i386 ``int 0x80`` on x86-64) kills the
process: syscall numbers differ there, so the list would not hold; x32 calls fail with EPERM.
Interpreters, compilers, test runners, git and pip never need these calls. Tables exist for
x86-64 and aarch64 (taken from the kernel's ``unistd`` headers); on other machines
``program()`` is None and sandboxes run without the filter (``bwrap.py`` says so).

    fd = filter_fd()                 # a memfd holding the program, or None
    argv = ["bwrap", "--seccomp", str(fd), ...]   # pass_fds=[fd] to the spawn, then close it
"""

from __future__ import annotations

import functools
import os
import platform
import struct

DENIED = (
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "bpf",
    "reboot", "swapon", "swapoff", "acct",
    "mount", "umount2", "pivot_root", "fsopen", "fsconfig", "fsmount", "fspick", "open_tree",
    "move_mount", "mount_setattr", "unshare", "setns",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "userfaultfd", "perf_event_open",
    "add_key", "request_key", "keyctl", "open_by_handle_at", "name_to_handle_at", "fanotify_init",
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp",
    "settimeofday", "clock_settime", "clock_adjtime", "quotactl", "quotactl_fd", "syslog",
    "iopl", "ioperm", "uselib", "ustat", "sysfs", "_sysctl", "lookup_dcookie",
)

# (AUDIT_ARCH_*, syscall numbers); a name missing from a table does not exist on that machine.
_TABLES: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (0xC000003E, {
        "init_module": 175, "finit_module": 313, "delete_module": 176, "kexec_load": 246,
        "kexec_file_load": 320, "bpf": 321, "reboot": 169, "swapon": 167, "swapoff": 168,
        "acct": 163, "mount": 165, "umount2": 166, "pivot_root": 155, "fsopen": 430,
        "fsconfig": 431, "fsmount": 432, "fspick": 433, "open_tree": 428, "move_mount": 429,
        "mount_setattr": 442, "unshare": 272, "setns": 308, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "userfaultfd": 323,
        "perf_event_open": 298, "add_key": 248, "request_key": 249, "keyctl": 250,
        "open_by_handle_at": 304, "name_to_handle_at": 303, "fanotify_init": 300, "ptrace": 101,
        "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312, "settimeofday": 164,
        "clock_settime": 227, "clock_adjtime": 305, "quotactl": 179, "quotactl_fd": 443,
        "syslog": 103, "iopl": 172, "ioperm": 173, "uselib": 134, "ustat": 136, "sysfs": 139,
        "_sysctl": 156, "lookup_dcookie": 212}),
    "aarch64": (0xC00000B7, {
        "init_module": 105, "finit_module": 273, "delete_module": 106, "kexec_load": 104,
        "kexec_file_load": 294, "bpf": 280, "reboot": 142, "swapon": 224, "swapoff": 225,
        "acct": 89, "mount": 40, "umount2": 39, "pivot_root": 41, "fsopen": 430, "fsconfig": 431,
        "fsmount": 432, "fspick": 433, "open_tree": 428, "move_mount": 429, "mount_setattr": 442,
        "unshare": 97, "setns": 268, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "userfaultfd": 282, "perf_event_open": 241, "add_key": 217,
        "request_key": 218, "keyctl": 219, "open_by_handle_at": 265, "name_to_handle_at": 264,
        "fanotify_init": 262, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271,
        "kcmp": 272, "settimeofday": 170, "clock_settime": 112, "clock_adjtime": 266,
        "quotactl": 60, "quotactl_fd": 443, "syslog": 116, "lookup_dcookie": 18}),
}
_X32_BIT = 0x40000000  # x86-64: syscalls of the x32 ABI carry this bit

# classic BPF (linux/filter.h, linux/seccomp.h)
_LD_W_ABS, _JEQ_K, _JSET_K, _RET_K = 0x20, 0x15, 0x45, 0x06
_RET_KILL_PROCESS, _RET_ERRNO, _RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
_EPERM = 1
_OFF_NR, _OFF_ARCH = 0, 4  # struct seccomp_data: int nr; __u32 arch; ...


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def compile_filter(arch: int, numbers: list[int], x32_bit: bool) -> bytes:
    """The cBPF program: kill on a foreign ABI, EPERM for ``numbers`` (and x32), else allow."""
    numbers = sorted(set(numbers))
    prog = [_insn(_LD_W_ABS, _OFF_ARCH), _insn(_JEQ_K, arch, jt=1),
            _insn(_RET_K, _RET_KILL_PROCESS), _insn(_LD_W_ABS, _OFF_NR)]
    # after the checks below: ALLOW at index n_checks, DENY at n_checks + 1
    checks = ([_X32_BIT] if x32_bit else []) + numbers
    for i, nr in enumerate(checks):
        to_deny = len(checks) - i  # skip the remaining checks and the ALLOW
        code = _JSET_K if x32_bit and i == 0 else _JEQ_K
        prog.append(_insn(code, nr, jt=to_deny))
    prog += [_insn(_RET_K, _RET_ALLOW), _insn(_RET_K, _RET_ERRNO | _EPERM)]
    return b"".join(prog)


@functools.lru_cache(maxsize=1)
def program() -> bytes | None:
    """This machine's filter, or None where looprl has no syscall table for it."""
    table = _TABLES.get(platform.machine())
    if table is None:
        return None
    arch, numbers = table
    return compile_filter(arch, [numbers[n] for n in DENIED if n in numbers],
                          x32_bit=platform.machine() == "x86_64")


def filter_fd() -> int | None:
    """A fresh fd (memfd, read position 0) holding ``program()`` for one bwrap to read, or None.
    Not inheritable: pass it with ``pass_fds`` and close it after the spawn."""
    prog = program()
    if prog is None:
        return None
    fd = os.memfd_create("looprl-seccomp", os.MFD_CLOEXEC)
    try:
        os.write(fd, prog)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd
