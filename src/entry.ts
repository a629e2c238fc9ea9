// Program entry (the bundle's and `node src/entry.ts`'s): the daemon, or one of the subcommands.
// Each path loads only what it uses: --version prints from a module of constants, and the rest is
// imported once chosen. In the bundle (esbuild, CommonJS) these imports become module wrappers run on
// first use, so gRPC, protobufjs and the daemon's code are evaluated only on the paths that reach them.
import { VERSION, versionText } from './system/version.ts';

const argv = process.argv.slice(2);
const sub = argv[0];
if (sub === 'mps-control-daemon') void import('./mps/daemon-main.ts').then((m) => m.mpsControlDaemon(argv.slice(1)));
else if (sub === 'info' || sub === 'check')
  void import('./cli/subcommands.ts').then((m) => m.runSubcommand(sub, argv.slice(1)));
else if (argv.includes('--version')) process.stdout.write(versionText());
else if (argv.includes('--help') || argv.includes('-h'))
  void import('./config/describe-options.ts').then((m) => process.stdout.write(m.helpText(VERSION)));
else void import('./main.ts').then((m) => m.main(argv));
