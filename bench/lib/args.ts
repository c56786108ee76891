// A benchmark's flags: `--help`, or a flag it does not know, prints the flags it takes (with
// their defaults) instead of a stack trace.
import { parseArgs, type ParseArgsConfig } from 'node:util';

type Options = NonNullable<ParseArgsConfig['options']>;

export function benchArgs<O extends Options>(options: O): ReturnType<typeof parseArgs<{ options: O }>>['values'] {
  let problem = '';
  if (!process.argv.slice(2).some((a) => a === '--help' || a === '-h')) {
    try {
      return parseArgs({ options }).values;
    } catch (err) {
      problem = `${(err as Error).message}\n`;
    }
  }
  const flags = Object.entries(options).map(([name, o]) => {
    const none = o.default === undefined || (Array.isArray(o.default) && o.default.length === 0);
    const value = o.type === 'boolean' ? '' : ` ${none ? 'VALUE' : String(o.default)}`;
    return `  --${name}${value}${o.multiple ? ' (repeatable)' : ''}`;
  });
  process.stderr.write(`${problem}flags (with their defaults):\n${flags.join('\n')}\n`);
  process.exit(problem ? 2 : 0);
}
