// A systemd stand-in for sd_notify: a unix datagram socket (via libc through koffi, since Node has
// none) collecting what the plugin sends to $NOTIFY_SOCKET.
import { EventEmitter } from 'node:events';
import koffi from 'koffi';
import { sockaddrUn } from '../../src/system/notify.ts';
import { onEvent, waitFor } from './wait.ts';

const lib = koffi.load('libc.so.6');
const socket = lib.func('int socket(int domain, int type, int protocol)') as (
  d: number,
  t: number,
  p: number,
) => number;
const bind = lib.func('int bind(int fd, const uint8_t *addr, uint32_t len)') as (
  fd: number,
  a: Buffer,
  l: number,
) => number;
const recv = lib.func('long recv(int fd, _Out_ uint8_t *buf, size_t len, int flags)') as (
  fd: number,
  b: Buffer,
  l: number,
  f: number,
) => number;
const close = lib.func('int close(int fd)') as (fd: number) => number;
const MSG_DONTWAIT = 0x40;

/** Emits 'message' for each datagram received. */
export class NotifySocket extends EventEmitter {
  readonly path: string;
  readonly messages: string[] = [];
  private readonly fd: number;
  private readonly timer: NodeJS.Timeout;

  constructor(path: string) {
    super();
    this.path = path;
    this.fd = socket(1, 2, 0);
    if (this.fd < 0) throw new Error('socket() failed');
    const addr = sockaddrUn(path);
    if (bind(this.fd, addr, addr.length) !== 0) throw new Error(`bind(${path}) failed`);
    const buf = Buffer.alloc(4096);
    this.timer = setInterval(() => {
      for (;;) {
        const n = recv(this.fd, buf, buf.length, MSG_DONTWAIT);
        if (n <= 0) break;
        this.messages.push(buf.toString('utf8', 0, n));
        this.emit('message');
      }
    }, 5);
  }

  /** The first message matching re, from message index `from` on. */
  waitFor(re: RegExp, timeoutMs = 5000, from = 0): Promise<string> {
    return waitFor(() => this.messages.slice(from).find((x) => re.test(x)), {
      on: onEvent(this, 'message'),
      deadlineMs: timeoutMs,
      what: () => `no sd_notify message matching ${re}; got ${JSON.stringify(this.messages)}`,
    });
  }

  close(): void {
    clearInterval(this.timer);
    close(this.fd);
  }
}
