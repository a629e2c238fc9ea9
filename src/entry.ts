// Program entry (the bundle's and `node src/entry.ts`'s): the daemon, or one of the subcommands.
import { main } from './main.ts';
import { runSubcommand } from './cli/subcommands.ts';

const argv = process.argv.slice(2);
if (argv[0] === 'info' || argv[0] === 'check') void runSubcommand(argv[0], argv.slice(1));
else void main(argv);
