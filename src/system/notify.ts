// sd_notify from the main process itself: a datagram to $NOTIFY_SOCKET through libc (Node has no
// unix datagram sockets). Never by spawning systemd-notify, whose messages systemd drops under
// NotifyAccess=main because they come from another process.
import type { Koffi } from './native.ts';

export interface Notifier {
  /** Sends one message (lines like READY=1, STATUS=…); returns false when it could not be sent. */
  notify(message: string): boolean;
  /** Watchdog interval asked by systemd (WATCHDOG_USEC), in ms, or null. */
  readonly watchdogMs: number | null;
  close(): void;
}

const AF_UNIX = 1;
const SOCK_DGRAM = 2;
const SOCK_CLOEXEC = 0o2000000;
const MSG_NOSIGNAL = 0x4000;
const SUN_PATH_MAX = 108;

/** The sockaddr_un bytes for a NOTIFY_SOCKET value ('@name' is an abstract socket). */
export function sockaddrUn(path: string): Buffer {
  const abstract = path.startsWith('@');
  const name = Buffer.from(abstract ? path.slice(1) : path, 'utf8');
  const len = name.length + (abstract ? 1 : 0);
  if (len >= SUN_PATH_MAX)
    throw new Error(`NOTIFY_SOCKET ${JSON.stringify(path)} is longer than a unix socket path can be`);
  const addr = Buffer.alloc(2 + (abstract ? len : len + 1));
  addr.writeUInt16LE(AF_UNIX, 0);
  name.copy(addr, abstract ? 3 : 2);
  return addr;
}

/** Watchdog interval in ms from WATCHDOG_USEC, if it is meant for this process (WATCHDOG_PID). */
export function watchdogInterval(env: NodeJS.ProcessEnv, pid: number): number | null {
  const usec = Number(env.WATCHDOG_USEC);
  if (!Number.isFinite(usec) || usec <= 0) return null;
  const forPid = env.WATCHDOG_PID;
  if (forPid !== undefined && forPid !== '' && Number(forPid) !== pid) return null;
  return usec / 1000;
}

const noop: Notifier = { notify: () => false, watchdogMs: null, close: () => undefined };

let libc:
  | {
      socket: (d: number, t: number, p: number) => number;
      sendto: (...a: unknown[]) => number;
      close: (fd: number) => number;
    }
  | undefined;

export function createNotifier(koffi: Koffi, env: NodeJS.ProcessEnv = process.env): Notifier {
  const path = env.NOTIFY_SOCKET;
  const watchdogMs = watchdogInterval(env, process.pid);
  if (path === undefined || path === '') return { ...noop, watchdogMs };
  if (libc === undefined) {
    const lib = koffi.load('libc.so.6');
    libc = {
      socket: lib.func('int socket(int domain, int type, int protocol)') as (d: number, t: number, p: number) => number,
      sendto: lib.func(
        'long sendto(int fd, const uint8_t *buf, size_t len, int flags, const uint8_t *addr, uint32_t addrlen)',
      ) as (...a: unknown[]) => number,
      close: lib.func('int close(int fd)') as (fd: number) => number,
    };
  }
  const c = libc;
  const addr = sockaddrUn(path);
  const fd = c.socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return { ...noop, watchdogMs };
  let open = true;
  return {
    watchdogMs,
    notify(message: string): boolean {
      if (!open) return false;
      const buf = Buffer.from(message, 'utf8');
      return c.sendto(fd, buf, buf.length, MSG_NOSIGNAL, addr, addr.length) === buf.length;
    },
    close(): void {
      if (open) c.close(fd);
      open = false;
    },
  };
}
