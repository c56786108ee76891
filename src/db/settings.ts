import type { Pool } from './pool.ts';

export async function loadSettings(pool: Pool): Promise<Record<string, unknown>> {
  const { rows } = await pool.query<{ name: string; value: unknown }>('SELECT name, value FROM sarsen.settings');
  return Object.fromEntries(rows.map((r) => [r.name, r.value]));
}

/** Returns false when no such setting exists (names are seeded by migration, never invented). */
export async function storeSetting(pool: Pool, name: string, value: unknown): Promise<boolean> {
  const { rowCount } = await pool.query(
    'UPDATE sarsen.settings SET value = $2::jsonb, updated_at = now() WHERE name = $1',
    [name, JSON.stringify(value)],
  );
  return rowCount === 1;
}
