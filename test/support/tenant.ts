// A ready-to-use tenancy for service-route tests, provisioned the way an operator would: a
// signed-in owner creates a namespace, one backend per dialect on the fake provider, routing
// rules (`gpt-*` to chat, `claude-*` to messages) and an API key, all through the admin routes.
import crypto from 'node:crypto';
import type { TestServer } from './server.ts';
import type { FakeProvider } from './fake-provider.ts';
import { call, ownerSession } from './control-plane.ts';
import { registerSecret } from './log-guard.ts';

export type Tenant = {
  tenancy: string;
  namespace: string;
  namespaceId: string;
  /** `{url}/{tenancy}/{namespace}/v1`: the openai client's baseURL */
  base: string;
  /** `{url}/{tenancy}/{namespace}`: the anthropic client's baseURL */
  root: string;
  key: string;
  apiKeyId: string;
  adminToken: string;
  backends: { chat: string; messages: string };
  chatCredential: string;
  messagesCredential: string;
  /** Adds a routing rule; answers its rule_id. */
  addRule(rule: { model: string; backend?: 'chat' | 'messages'; rewrite_model?: string; action?: 'route' | 'decline'; priority?: number }): Promise<string>;
  /** Issues another key in this namespace. */
  newKey(grants: ('use' | 'manage')[]): Promise<{ key: string; apiKeyId: string }>;
};

let counter = 0;

export async function provision(server: TestServer, provider: FakeProvider, opts: { namespace?: string } = {}): Promise<Tenant> {
  const tenancy = `t${process.pid}-${++counter}-${crypto.randomBytes(2).toString('hex')}`;
  const namespace = opts.namespace ?? 'main';
  const { token } = await ownerSession(server, tenancy);
  const admin = async (method: string, path: string, body?: unknown) => {
    const res = await call(server.url, method, `/${tenancy}/v1${path}`, { token, body });
    if (res.status >= 300) throw new Error(`${method} ${path}: ${res.status} ${res.text}`);
    return res.body;
  };
  const ns = await admin('POST', '/namespaces', { name: namespace });
  const nsPath = `/namespaces/${namespace}`;
  const chatCredential = `sk-chat-${crypto.randomBytes(12).toString('hex')}`;
  const messagesCredential = `sk-ant-api03-${crypto.randomBytes(12).toString('hex')}`;
  registerSecret(chatCredential);
  registerSecret(messagesCredential);
  const chat = await admin('POST', `${nsPath}/backends`, { name: 'chat', kind: 'chat_compat', address: `${provider.url}/v1`, credential: chatCredential });
  const messages = await admin('POST', `${nsPath}/backends`, { name: 'messages', kind: 'messages', address: provider.url, credential: messagesCredential });
  const backends = { chat: chat.backend_id as string, messages: messages.backend_id as string };
  const addRule: Tenant['addRule'] = async (r) => {
    const body: Record<string, unknown> = { model: r.model, action: r.action ?? 'route' };
    if ((r.action ?? 'route') === 'route') body.backend_id = backends[r.backend ?? 'chat'];
    if (r.rewrite_model) body.rewrite_model = r.rewrite_model;
    if (r.priority !== undefined) body.priority = r.priority;
    return (await admin('POST', `${nsPath}/routing-rules`, body)).rule_id as string;
  };
  await addRule({ model: 'gpt-*', backend: 'chat' });
  await addRule({ model: 'claude-*', backend: 'messages' });
  const newKey: Tenant['newKey'] = async (grants) => {
    const k = await admin('POST', `${nsPath}/api-keys`, { name: `key-${crypto.randomBytes(3).toString('hex')}`, grants });
    registerSecret(k.key);
    return { key: k.key as string, apiKeyId: k.api_key_id as string };
  };
  const { key, apiKeyId } = await newKey(['use', 'manage']);
  return {
    tenancy,
    namespace,
    namespaceId: ns.namespace_id,
    base: `${server.url}/${tenancy}/${namespace}/v1`,
    root: `${server.url}/${tenancy}/${namespace}`,
    key,
    apiKeyId,
    adminToken: token,
    backends,
    chatCredential,
    messagesCredential,
    addRule,
    newKey,
  };
}
