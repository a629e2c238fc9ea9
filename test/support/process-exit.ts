// A trigger for test/support/wait.ts: the end of a process, through its pidfd. Kept apart from
// wait.ts because it loads koffi, which the stand-ins bundled for the real-systemd container lack.
import koffi from 'koffi';
import type { Trigger } from './wait.ts';

const libc = koffi.load('libc.so.6');
const syscall = libc.func('long syscall(long number, int pid, unsigned int flags)') as (
  n: number,
  pid: number,
  flags: number,
) => number;
koffi.struct('gdp_wait_pollfd', { fd: 'int', events: 'short', revents: 'short' });
const poll = libc.func('int poll(_Inout_ gdp_wait_pollfd *fds, unsigned long nfds, int timeout)');
const closeFd = libc.func('int close(int fd)') as (fd: number) => number;
const SYS_PIDFD_OPEN = 434;
const POLLIN = 1;

/**
 * The end of a process that need not be this one's child (a daemon that forked away): a pidfd waited
 * on in koffi's worker thread, readable once the process has ended. One that is already gone fires at
 * once. The wait in the worker is bounded by `boundMs`, so an unsubscribed trigger frees its thread.
 */
export function onProcessExit(pid: number, boundMs = 60_000): Trigger {
  return (again) => {
    const fd = syscall(SYS_PIDFD_OPEN, pid, 0);
    if (fd < 0) {
      // No such process (ESRCH): it has ended already.
      queueMicrotask(again);
      return () => undefined;
    }
    const fds = { fd, events: POLLIN, revents: 0 };
    let closed = false;
    (poll as unknown as { async: (...a: unknown[]) => void }).async(fds, 1, boundMs, () => {
      closeFd(fd);
      if (!closed) again();
    });
    return () => {
      closed = true;
    };
  };
}
