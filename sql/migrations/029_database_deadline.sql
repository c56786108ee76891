-- Up Migration

-- How long one round trip to the database may take before the connection it went out on is
-- presumed dead, destroyed and replaced (docs/operations.md "When the network goes silent").
-- Hot statements take milliseconds; ten seconds leaves a slow disk and a busy server room, and
-- still lets a process find out within seconds that its connections went silent.
INSERT INTO sarsen.settings (name, value) VALUES ('database_deadline_ms', '10000') ON CONFLICT (name) DO NOTHING;
