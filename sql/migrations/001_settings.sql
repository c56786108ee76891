-- Up Migration

CREATE SCHEMA IF NOT EXISTS sarsen;

-- Every figure the deployment charges or enforces (docs/operations.md "Settings"). The defaults
-- live here and nowhere else; src/config/settings.ts validates each value by name.
CREATE TABLE sarsen.settings (
  name       text PRIMARY KEY,
  value      jsonb NOT NULL,
  updated_at timestamptz NOT NULL DEFAULT now()
);

INSERT INTO sarsen.settings (name, value) VALUES
  ('synchronous_hold_ms',          '300000'),
  ('idempotency_window_ms',        '600000'),
  ('lease_ms',                     '30000'),
  ('heartbeat_ms',                 '10000'),
  ('sweep_interval_ms',            '2000'),
  ('max_attempts',                 '3'),
  ('retry_base_ms',                '1000'),
  ('retry_max_ms',                 '60000'),
  ('shutdown_grace_ms',            '30000'),
  ('backends_public_only',         'true'),
  ('upstream_connect_timeout_ms',  '10000'),
  ('upstream_headers_timeout_ms',  '600000'),
  ('upstream_idle_timeout_ms',     '300000'),
  ('metadata_horizon_minutes',     '129600'),
  ('listing_horizon_days',         '400'),
  ('ledger_horizon_days',          '2557'),
  ('reroute_ceiling',              '5'),
  ('metering_enabled',             'false'),
  ('request_fee_micros',           '0');

-- Every process listens on sarsen_events; a changed setting tells them to re-read.
CREATE FUNCTION sarsen.settings_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('sarsen_events', '{"k":"settings"}');
  RETURN NULL;
END $$;

CREATE TRIGGER settings_changed AFTER INSERT OR UPDATE OR DELETE ON sarsen.settings
  FOR EACH STATEMENT EXECUTE FUNCTION sarsen.settings_changed();
