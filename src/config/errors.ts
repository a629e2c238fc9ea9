// The two errors a configuration is refused with; exit-codes.ts maps both to exit status 2.

/** A bad option, environment variable or config file entry; the message names it. */
export class OptionError extends Error {
  override name = 'OptionError';
}

/** A problem with the config file; the message starts with `config file <path>:` and the key path. */
export class ConfigError extends OptionError {
  override name = 'ConfigError';
}
