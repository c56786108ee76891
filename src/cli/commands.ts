// The `sarsen` commands as one table: each one's words, arguments and flags. One parser reads
// every command line against it and one printer turns it into the usage, and `--help` (`-h`)
// is a flag of every command, so a command added here answers it with no code of its own
// (test/integration/command-help.test.ts walks the table).
import { parseArgs } from 'node:util';
import { ConfigError, SERVE_FLAGS } from '../config/config.ts';
import type { Flags } from '../core/flags.ts';
import { BATCH_FLAGS } from './batch.ts';
import { EXPORT_FLAGS } from './export.ts';

export type Command = Readonly<{
  /** The words that name it, such as `settings get`. */
  name: string;
  /** Its arguments as the usage shows them: `NAME VALUE`, `[NAME]` (optional), `[COMMAND ...]` (any number). */
  args: string;
  summary: string;
  flags: Flags;
  /** It reads no CTX_ environment and opens no database (an HTTP client, or a printer). */
  standalone: boolean;
}>;

const NONE = {} as const satisfies Flags;

export const COMMANDS = [
  { name: 'serve', args: '', summary: 'applies pending migrations, then serves (the command when none is named)', flags: SERVE_FLAGS, standalone: false },
  { name: 'migrate', args: '', summary: 'applies pending migrations and exits', flags: NONE, standalone: false },
  { name: 'openapi', args: '', summary: 'prints the OpenAPI 3.1 document', flags: NONE, standalone: true },
  { name: 'settings get', args: '[NAME]', summary: 'prints every setting, or one', flags: NONE, standalone: false },
  { name: 'settings set', args: 'NAME VALUE', summary: 'validates and stores a setting (running processes pick it up)', flags: NONE, standalone: false },
  {
    name: 'tenancy create',
    args: 'SLUG',
    summary: 'creates a tenancy and its owner; prints the owner\'s password once',
    flags: { owner: { type: 'string', value: 'EMAIL', required: true, help: 'the owner\'s email address' } },
    standalone: false,
  },
  {
    name: 'apply',
    args: 'FILE',
    summary: 'makes a tenancy\'s namespaces, backends, rules and keys what FILE says',
    flags: {
      prune: { type: 'boolean', help: 'also deletes what FILE does not name' },
      'dry-run': { type: 'boolean', help: 'prints the plan and changes nothing' },
      'credential-passthrough': { type: 'boolean', help: 'allows backends with credential_source: caller, as serve --credential-passthrough does' },
    },
    standalone: false,
  },
  { name: 'credit grant', args: 'TENANCY MICRO_CREDITS', summary: 'adds credit to a tenancy', flags: NONE, standalone: false },
  { name: 'prices set', args: 'MODEL PROMPT_PER_MTOK COMPLETION_PER_MTOK', summary: 'sets a model\'s prices (micro-credits per million tokens)', flags: NONE, standalone: false },
  { name: 'batch run', args: 'INPUT.jsonl', summary: 'submits a batch file over HTTP and collects the results', flags: BATCH_FLAGS, standalone: true },
  { name: 'export', args: '', summary: 'writes a namespace\'s records to a file, over HTTP', flags: EXPORT_FLAGS, standalone: true },
  { name: 'help', args: '[COMMAND ...]', summary: 'prints this overview, or a command\'s usage', flags: NONE, standalone: true },
] as const satisfies readonly Command[];

export type CommandName = (typeof COMMANDS)[number]['name'];

/** The words that start a command's name but are not one (`settings`), each with its commands. */
export function groups(): Map<string, Command[]> {
  const found = new Map<string, Command[]>();
  for (const c of COMMANDS) {
    const [first, ...more] = c.name.split(' ');
    if (more.length > 0) found.set(first!, [...(found.get(first!) ?? []), c]);
  }
  return found;
}

const HELP = { help: { type: 'boolean', short: 'h' } } as const;

const ENVIRONMENT = `environment: CTX_DATABASE_HOST, CTX_DATABASE_PORT, CTX_DATABASE_USER, CTX_DATABASE_NAME,
             CTX_SECRETS_DIR, CTX_DATA_DIR, CTX_LOG_LEVEL, CTX_PROCESSES (see .env.example)`;

function flagWords(name: string, f: Flags[string]): string {
  return f.type === 'string' ? `--${name} ${f.value}` : `--${name}`;
}

/** `sarsen export --tenancy T ... [--since S]`: required flags bare, the others in brackets. */
export function synopsis(c: Command): string {
  const flags = Object.entries(c.flags).map(([name, f]) => (f.type === 'string' && f.required ? flagWords(name, f) : `[${flagWords(name, f)}]`));
  return ['sarsen', c.name, c.args, ...flags].filter(Boolean).join(' ');
}

/** The usage of one command, or of a group's commands: synopsis, what it does, a line per flag. */
export function usage(...commands: Command[]): string {
  const blocks = commands.map(block).join('\n\n');
  return commands.some((c) => !c.standalone) ? `${blocks}\n\n${ENVIRONMENT}` : blocks;
}

function block(c: Command): string {
  const rows: [string, string][] = Object.entries(c.flags).map(([name, f]) => [
    flagWords(name, f),
    f.type === 'string' && f.default !== undefined ? `${f.help} (default ${f.default})` : f.help,
  ]);
  rows.push(['-h, --help', 'prints this usage']);
  const width = Math.max(...rows.map(([left]) => left.length));
  return [
    `usage: ${synopsis(c)}`,
    `  ${c.summary}`,
    '',
    ...rows.map(([left, help]) => `  ${left.padEnd(width)}  ${help}`),
  ].join('\n');
}

/** `sarsen --help`: every command in a line. */
export function overview(): string {
  const rows = COMMANDS.map((c) => [['sarsen', c.name, c.args].filter(Boolean).join(' '), c.summary] as const);
  const width = Math.max(...rows.map(([left]) => left.length));
  return [
    'usage: sarsen COMMAND [ARGUMENTS] [FLAGS]',
    '',
    ...rows.map(([left, summary]) => `  ${left.padEnd(width)}  ${summary}`),
    '',
    'sarsen COMMAND --help prints a command\'s flags.',
    ENVIRONMENT,
  ].join('\n');
}

/** The command the words name (the longest match), and the words after its name. */
function lookup(words: string[]): { command: Command; rest: string[] } | undefined {
  const named = COMMANDS.filter((c) => c.name.split(' ').every((w, i) => words[i] === w));
  const command = named.sort((a, b) => b.name.length - a.name.length)[0];
  return command && { command, rest: words.slice(command.name.split(' ').length) };
}

/** The usage `sarsen help WORDS` prints: a command's, a group's, or the overview. */
export function helpFor(words: string[]): string {
  if (words.length === 0) return overview();
  const found = lookup(words);
  if (found) return usage(found.command);
  const group = groups().get(words[0]!);
  if (group) return usage(...group);
  throw new ConfigError(`Unknown command ${JSON.stringify(words.join(' '))}.\n${overview()}`);
}

export type Invocation =
  | { help: string }
  | { command: CommandName; args: string[]; flags: Record<string, string | boolean | undefined> };

/**
 * Reads a command line against the table. The command's words come first; with none it is
 * `serve`. --help or -h anywhere answers the usage instead, even beside flags the command
 * does not take.
 */
export function parseInvocation(argv: string[]): Invocation {
  const firstFlag = argv.findIndex((a) => a.startsWith('-'));
  const words = firstFlag < 0 ? argv : argv.slice(0, firstFlag);
  const found = words.length === 0 ? { command: COMMANDS[0] as Command, rest: [] } : lookup(words);
  const command = found?.command;
  const after = argv.slice(words.length - (found?.rest.length ?? words.length));
  const options = { ...command?.flags, ...HELP };
  let parsed;
  let refused: Error | undefined;
  try {
    parsed = parseArgs({ args: after, options, allowPositionals: true, strict: true });
  } catch (err) {
    // A flag the command does not take: --help still answers.
    refused = err as Error;
    parsed = parseArgs({ args: after, options, allowPositionals: true, strict: false });
  }
  if (parsed.values.help === true) return { help: words.length === 0 ? overview() : helpFor(words) };
  if (!command) {
    const group = groups().get(words[0]!);
    if (!group) throw new ConfigError(`Unknown command ${JSON.stringify(words.join(' '))}.\n${overview()}`);
    throw new ConfigError(`${words[0]} needs one of: ${group.map((c) => c.name.split(' ')[1]).join(', ')}.\n${usage(...group)}`);
  }
  if (refused) throw new ConfigError(`${refused.message}\n${usage(command)}`);
  const args = parsed.positionals;
  const spec = command.args.match(/\[[^\]]*\]|\S+/g) ?? [];
  const least = spec.filter((a) => !a.startsWith('[')).length;
  const most = spec.some((a) => a.endsWith('...]')) ? Infinity : spec.length;
  if (args.length < least || args.length > most) {
    throw new ConfigError(`${command.name} takes ${command.args ? `the arguments ${command.args}` : 'no arguments'}.\n${usage(command)}`);
  }
  for (const [name, f] of Object.entries(command.flags)) {
    if (f.type === 'string' && f.required && (parsed.values as Record<string, unknown>)[name] === undefined) throw new ConfigError(`${command.name} needs --${name}.\n${usage(command)}`);
  }
  const { help: _, ...flags } = parsed.values as Record<string, string | boolean | undefined>;
  return { command: command.name as CommandName, args, flags };
}
