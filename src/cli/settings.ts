import type { OpenDatabase } from './database.ts';
import { createPool } from '../db/pool.ts';
import { migrate } from '../db/migrate.ts';
import { loadSettings } from '../db/settings.ts';
import { setSetting, isSettingName, SettingError } from '../config/settings.ts';

export async function settingsCommand(db: OpenDatabase, args: string[], out: (line: string) => void): Promise<void> {
  const pool = createPool(db.conn, { max: 2, name: 'sarsen-cli' });
  try {
    await migrate(db.conn, pool);
    const [verb, name, value, ...rest] = args;
    if (verb === 'get' && rest.length === 0 && value === undefined) {
      const all = await loadSettings(pool);
      if (name !== undefined) {
        if (!isSettingName(name)) throw new SettingError(`Unknown setting ${JSON.stringify(name)}.`);
        out(JSON.stringify(all[name]));
      } else {
        for (const key of Object.keys(all).sort()) out(`${key} ${JSON.stringify(all[key])}`);
      }
      return;
    }
    if (verb === 'set' && name !== undefined && value !== undefined && rest.length === 0) {
      const stored = await setSetting(pool, name, value);
      out(`${name} ${JSON.stringify(stored)}`);
      return;
    }
    throw new SettingError('usage: sarsen settings get [NAME] | sarsen settings set NAME VALUE');
  } finally {
    await pool.end();
  }
}
