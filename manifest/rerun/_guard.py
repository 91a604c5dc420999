"""The unconfined re-run's keeper: the command never outlives the verb that started it.

Run as ``python -I -S _guard.py -- CMD...`` (isolated, no site: it imports
nothing of ours and is never prepared by the launcher; about 15 ms). A
confined re-run has bubblewrap's ``--die-with-parent`` and a PID namespace;
an unconfined one had nothing, so a ``kill -9`` of verify left the training
running with nobody to own it (on a GPU box, a job holding the card). This
process sits between the verb and the command:

* ``PR_SET_PDEATHSIG``: the kernel sends it SIGTERM the moment its parent
  (the verb) dies, however it dies, SIGKILL included;
* ``PR_SET_CHILD_SUBREAPER``: every descendant whose parent exits is
  re-parented here, not to init, so one that left the process group
  (``setsid``) is still found;
* the command runs in a session (so a process group) of its own, as
  bubblewrap's ``--new-session`` does: no controlling terminal, so a command
  that writes to the terminal under ``stty tostop`` or opens ``/dev/tty``
  (``getpass``) is not stopped by SIGTTOU/SIGTTIN as a background job, which
  hung the verb (nor can it push input into the user's terminal); on SIGTERM,
  SIGHUP or SIGINT, and also when the command itself exits, the group is
  killed and every descendant still alive is killed and reaped before this exits.

Exit status: the command's own (a command killed by a signal makes this die
of the same signal), 127 when the command cannot be started.
"""

import contextlib
import ctypes
import errno
import os
import signal
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def _children(me: int) -> list[int]:
    """Live processes whose parent is ``me`` (our re-parented descendants included)."""
    out: list[int] = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # The command name is in parentheses and may hold spaces or ')'.
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1 and int(fields[1]) == me:
            out.append(int(name))
    return out


def _reap_all(group: int) -> None:
    """Kill the command's group and every descendant left, until none is left."""
    me = os.getpid()
    with contextlib.suppress(OSError):
        os.killpg(group, signal.SIGKILL)
    while True:
        for pid in _children(me):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return  # nothing of ours is left
        except InterruptedError:
            continue
        if pid == 0:  # all killed, not all reaped yet (or one was re-parented just now)
            time.sleep(0.01)


def main() -> int:
    argv = sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else []
    if not argv:
        sys.stderr.write("manifest: guard: no command given\n")
        return 2
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1)
    except (OSError, AttributeError):
        pass  # not Linux: the process group and the signal handlers still hold
    if os.getppid() != parent:  # the verb died before the death signal was armed
        return 128 + signal.SIGTERM
    read_end, write_end = os.pipe()
    os.set_inheritable(write_end, False)
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            os.setsid()  # its own session and group (pgid = pid); no controlling terminal
            for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
                signal.signal(signum, signal.SIG_DFL)
            os.execvp(argv[0], argv)  # noqa: S606 (argv is the planned command)
        except OSError as exc:
            os.write(write_end, str(exc.errno or errno.ENOENT).encode())
        os._exit(127)
    os.close(write_end)
    # No setpgid(pid, pid) here: it would make the child a group leader, and its
    # setsid() would then fail. Until the child has its group, _reap_all finds it
    # among our children.

    def stop(signum: int, frame: object) -> None:
        del frame
        _reap_all(pid)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, stop)
    failed = os.read(read_end, 32)
    os.close(read_end)
    if failed:
        code = int(failed) if failed.isdigit() else errno.ENOENT
        sys.stderr.write(f"manifest: cannot start {argv[0]}: {os.strerror(code)}\n")
        _reap_all(pid)
        return 127
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    _reap_all(pid)  # whatever the command left running dies with it
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        return 128 + sig
    return os.WEXITSTATUS(status)


if __name__ == "__main__":
    sys.exit(main())
