// A command's flags as one table: node:util's parseArgs reads it, and src/cli/commands.ts
// prints it as the command's usage, so the usage cannot name a flag the parser does not know.
export type Flag = Readonly<
  | { type: 'string'; /** its argument as the usage names it */ value: string; help: string; default?: string; required?: boolean }
  | { type: 'boolean'; help: string }
>;

export type Flags = Readonly<Record<string, Flag>>;

/** What parsing answers for each flag: a string flag with a default, or a required one, always has a value. */
export type FlagValues<F extends Flags> = {
  [K in keyof F]: F[K] extends { type: 'boolean' } ? boolean | undefined : F[K] extends { default: string } | { required: true } ? string : string | undefined;
};
