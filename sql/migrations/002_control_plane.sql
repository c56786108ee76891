-- Up Migration

-- The control plane (docs/administration.md): tenancies and their console accounts, namespaces,
-- backends, routing rules and API keys. Ids are prefixed ULIDs made by the application.

CREATE TABLE sarsen.tenancies (
  id                text PRIMARY KEY CHECK (id LIKE 'ten\_%'),
  slug              text NOT NULL UNIQUE CHECK (slug ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
  display_name      text NOT NULL,
  -- NULL: unset, every record kept (up to the deployment's metadata horizon).
  retention_minutes integer CHECK (retention_minutes >= 0),
  created_at        timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE sarsen.users (
  id              text PRIMARY KEY CHECK (id LIKE 'usr\_%'),
  tenancy_id      text NOT NULL REFERENCES sarsen.tenancies (id) ON DELETE CASCADE,
  email           text NOT NULL CHECK (email = lower(email) AND email <> ''),
  password_hash   text NOT NULL,
  -- False while the account holds a generated password: every route but the password
  -- change answers 403 password_change_required.
  password_chosen boolean NOT NULL DEFAULT false,
  role            text NOT NULL CHECK (role IN ('owner', 'admin', 'viewer')),
  disabled        boolean NOT NULL DEFAULT false,
  created_at      timestamptz NOT NULL DEFAULT now(),
  UNIQUE (tenancy_id, email)
);

-- Console sessions. Only the SHA-256 of the bearer token is stored: a copy of this table
-- does not let anyone sign in.
CREATE TABLE sarsen.sessions (
  token_hash bytea PRIMARY KEY CHECK (length(token_hash) = 32),
  user_id    text NOT NULL REFERENCES sarsen.users (id) ON DELETE CASCADE,
  created_at timestamptz NOT NULL DEFAULT now(),
  expires_at timestamptz NOT NULL
);
CREATE INDEX sessions_user_idx ON sarsen.sessions (user_id);

CREATE TABLE sarsen.namespaces (
  id                text PRIMARY KEY CHECK (id LIKE 'ns\_%'),
  tenancy_id        text NOT NULL REFERENCES sarsen.tenancies (id) ON DELETE CASCADE,
  -- `v1` would collide with the control plane under /{tenancy}/v1/...
  name              text NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9-]{0,62}$' AND name <> 'v1'),
  retention_minutes integer CHECK (retention_minutes >= 0),
  spend_limit       bigint CHECK (spend_limit >= 0),
  created_at        timestamptz NOT NULL DEFAULT now(),
  UNIQUE (tenancy_id, name)
);

CREATE TABLE sarsen.backends (
  id                text PRIMARY KEY CHECK (id LIKE 'bk\_%'),
  namespace_id      text NOT NULL REFERENCES sarsen.namespaces (id) ON DELETE CASCADE,
  name              text NOT NULL,
  kind              text NOT NULL CHECK (kind IN ('chat_compat', 'messages', 'aggregator')),
  dialect           text NOT NULL CHECK (dialect IN ('chat', 'messages')),
  address           text NOT NULL CHECK (address ~ '^https?://'),
  -- AES-256-GCM under credential-key, bound to the row's id: [version][nonce][ct][tag].
  credential_sealed bytea,
  credential_source text NOT NULL DEFAULT 'stored' CHECK (credential_source IN ('stored', 'caller')),
  created_at        timestamptz NOT NULL DEFAULT now(),
  UNIQUE (namespace_id, name),
  -- Lets routing rules reference a backend of their own namespace only.
  UNIQUE (namespace_id, id),
  CHECK ((kind = 'messages') = (dialect = 'messages')),
  CHECK (credential_source = 'stored' OR credential_sealed IS NULL)
);

CREATE TABLE sarsen.routing_rules (
  id            text PRIMARY KEY CHECK (id LIKE 'rule\_%'),
  namespace_id  text NOT NULL REFERENCES sarsen.namespaces (id) ON DELETE CASCADE,
  model         text NOT NULL CHECK (model <> ''),
  backend_id    text,
  rewrite_model text CHECK (rewrite_model <> ''),
  priority      integer NOT NULL DEFAULT 0,
  action        text NOT NULL DEFAULT 'route' CHECK (action IN ('route', 'decline')),
  created_at    timestamptz NOT NULL DEFAULT now(),
  -- NO ACTION (checked at the end of the statement), not RESTRICT: deleting a namespace
  -- cascades to both tables at once; deleting a backend that rules use is refused.
  FOREIGN KEY (namespace_id, backend_id) REFERENCES sarsen.backends (namespace_id, id),
  CHECK ((action = 'route') = (backend_id IS NOT NULL)),
  CHECK (action = 'route' OR rewrite_model IS NULL)
);
CREATE INDEX routing_rules_namespace_idx ON sarsen.routing_rules (namespace_id);
CREATE INDEX routing_rules_backend_idx ON sarsen.routing_rules (backend_id) WHERE backend_id IS NOT NULL;

CREATE TABLE sarsen.api_keys (
  id           text PRIMARY KEY CHECK (id LIKE 'key\_%'),
  namespace_id text NOT NULL REFERENCES sarsen.namespaces (id) ON DELETE CASCADE,
  name         text NOT NULL,
  prefix       text NOT NULL UNIQUE CHECK (prefix ~ '^[A-Za-z0-9]{8}$'),
  -- HMAC-SHA256 of the secret under api-key-hash-key; the secret itself is never stored.
  secret_hash  bytea NOT NULL CHECK (length(secret_hash) = 32),
  grants       text[] NOT NULL CHECK (grants <@ ARRAY['use', 'manage'] AND 'use' = ANY (grants)),
  spend_limit  bigint CHECK (spend_limit >= 0),
  created_at   timestamptz NOT NULL DEFAULT now(),
  last_used_at timestamptz,
  -- A revoked key keeps its row: requests and the ledger still name it.
  revoked_at   timestamptz
);
CREATE INDEX api_keys_namespace_idx ON sarsen.api_keys (namespace_id);
-- A name may be reused once the key holding it is revoked.
CREATE UNIQUE INDEX api_keys_live_name_idx ON sarsen.api_keys (namespace_id, name) WHERE revoked_at IS NULL;

-- Every process caches routing per namespace and key lookups per prefix; these triggers tell
-- all of them (over the event bus) when a cached answer may have changed. Being triggers,
-- they also fire for cascades and for changes made outside the application.
CREATE FUNCTION sarsen.routing_changed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  ns text;
BEGIN
  IF TG_OP = 'DELETE' THEN ns := OLD.namespace_id; ELSE ns := NEW.namespace_id; END IF;
  PERFORM pg_notify('sarsen_events', json_build_object('k', 'routing', 'namespace_id', ns)::text);
  IF TG_OP = 'UPDATE' AND OLD.namespace_id IS DISTINCT FROM NEW.namespace_id THEN
    PERFORM pg_notify('sarsen_events', json_build_object('k', 'routing', 'namespace_id', OLD.namespace_id)::text);
  END IF;
  RETURN NULL;
END $$;

CREATE TRIGGER routing_rules_changed AFTER INSERT OR UPDATE OR DELETE ON sarsen.routing_rules
  FOR EACH ROW EXECUTE FUNCTION sarsen.routing_changed();
CREATE TRIGGER backends_changed AFTER INSERT OR UPDATE OR DELETE ON sarsen.backends
  FOR EACH ROW EXECUTE FUNCTION sarsen.routing_changed();

CREATE FUNCTION sarsen.api_key_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('sarsen_events', json_build_object('k', 'api-key', 'prefix', OLD.prefix)::text);
  RETURN NULL;
END $$;

-- Not on last_used_at: the coalescing flusher's writes change nothing a cache holds.
CREATE TRIGGER api_keys_changed AFTER UPDATE OF revoked_at, grants, secret_hash, namespace_id, prefix OR DELETE
  ON sarsen.api_keys FOR EACH ROW EXECUTE FUNCTION sarsen.api_key_changed();
