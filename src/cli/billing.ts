// `sarsen credit grant <tenancy> <micro-credits>` and `sarsen prices set <model> <prompt> <completion>`
// (prices in micro-credits per million tokens). Amounts are integers: no floats in the ledger.
import type { OpenDatabase } from './database.ts';
import { ConfigError } from '../config/config.ts';
import { createPool } from '../db/pool.ts';
import { migrate } from '../db/migrate.ts';
import { grantCredit, setPrice } from '../db/accounting.ts';

const USAGE = 'usage: sarsen credit grant TENANCY MICRO_CREDITS | sarsen prices set MODEL PROMPT_PER_MTOK COMPLETION_PER_MTOK';

function amount(text: string | undefined, what: string): number {
  const n = text !== undefined && /^\d{1,15}$/.test(text) ? Number(text) : NaN;
  if (!Number.isSafeInteger(n)) throw new ConfigError(`${what} must be an integer number of micro-credits.\n${USAGE}`);
  return n;
}

export async function billingCommand(db: OpenDatabase, name: 'credit' | 'prices', args: string[], out: (line: string) => void): Promise<void> {
  const [verb, subject, ...rest] = args;
  const pool = createPool(db.conn, { max: 2, name: 'sarsen-cli' });
  try {
    await migrate(db.conn, pool);
    if (name === 'credit' && verb === 'grant' && subject && rest.length === 1) {
      const balance = await grantCredit(pool, subject, amount(rest[0], 'The amount'));
      if (balance === null) throw new ConfigError(`No tenancy ${JSON.stringify(subject)}.`);
      out(`balance: ${balance}`);
      return;
    }
    if (name === 'prices' && verb === 'set' && subject && rest.length === 2) {
      await setPrice(pool, subject, amount(rest[0], 'The prompt price'), amount(rest[1], 'The completion price'));
      out(`price: ${subject} prompt ${rest[0]} completion ${rest[1]} micro-credits per million tokens`);
      return;
    }
    throw new ConfigError(USAGE);
  } finally {
    await pool.end();
  }
}
