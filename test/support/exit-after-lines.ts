// A child for test/unit/exit-line.test.ts: logs N INFO lines through the daemon's stderr logger, then
// one ERROR line saying why it ends, and ends through exitProcess (src/system/log.ts), as the daemon
// does when it loses its socket directory or cannot start. Says `ending` on stdout first.
import { writeSync } from 'node:fs';
import { exitProcess, stderrLogger } from '../../src/system/log.ts';

const n = Number(process.argv[2] ?? '0');
const log = stderrLogger('info');
for (let i = 0; i < n; i++)
  log.info('filler line to fill the socket journald is not reading', { i, pad: 'x'.repeat(80) });
log.error('lost the socket directory: the last line, which must reach the reader');
// Tells the test (stdout) that stderr's reader may start reading: journald catching up.
writeSync(1, 'ending\n');
exitProcess(Number(process.argv[3] ?? '1'));
