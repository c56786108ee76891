import { expect } from 'chai';
import {
  CanonicalJsonError, JsonNumber, identityHash, isJsonNumber, jsonNumber, jsonString, parseCanonical,
  stringifyCanonical, topLevelBoolean, topLevelString, withTopLevelField,
} from '../../src/core/canonical-json.ts';
import type { JsonValue } from '../../src/core/canonical-json.ts';
import { prng, type Rnd } from '../support/prng.ts';

// ---- seeded random JSON: a tree, an independent expected canonical text, and many spellings of it

type Node =
  | { k: 'lit'; text: 'true' | 'false' | 'null' }
  | { k: 'num'; lexeme: string }
  | { k: 'str'; value: string }
  | { k: 'arr'; items: Node[] }
  | { k: 'obj'; entries: [string, Node][] };



const int = (rnd: Rnd, n: number) => Math.floor(rnd() * n);
const pick = <T>(rnd: Rnd, xs: readonly T[]): T => xs[int(rnd, xs.length)];

const NUMBERS = ['0', '-0', '1', '1.0', '100', '1e2', '1E2', '1e+2', '1.5e-3', '0.7', '4096', '-12.250',
  '12345678901234567890', '12345678901234567891', '-9007199254740993', '3.141592653589793238462643'];
const CHARS = ['a', 'b', 'Z', ' ', '/', '"', '\\', '\n', '\t', '\b', '\f', '\r', '\u0000', '\u001f', '\u007f',
  'é', '中', '\u2028', '\ufeff', '🙂', '\ud800', '\udfff', 'key', '0', '9'];
const KEYS = ['a', 'b', 'B', 'aa', 'ab', '', '1', '10', '2', 'é', 'z', '🙂', '\uff5e', 'model', 'a\nb', '\ud83d'];

function randomString(rnd: Rnd, max: number): string {
  let s = '';
  for (let n = int(rnd, max); n > 0; n--) s += pick(rnd, CHARS);
  return s;
}

function randomNode(rnd: Rnd, depth: number): Node {
  const r = rnd();
  if (depth <= 0 || r < 0.45) {
    const t = int(rnd, 6);
    if (t === 0) return { k: 'lit', text: pick(rnd, ['true', 'false', 'null'] as const) };
    if (t <= 2) return { k: 'num', lexeme: rnd() < 0.7 ? pick(rnd, NUMBERS) : String(int(rnd, 1e6) - 5e5) };
    return { k: 'str', value: randomString(rnd, 8) };
  }
  const n = int(rnd, 6);
  if (r < 0.7) return { k: 'arr', items: Array.from({ length: n }, () => randomNode(rnd, depth - 1)) };
  return { k: 'obj', entries: Array.from({ length: n }, () => [pick(rnd, KEYS), randomNode(rnd, depth - 1)]) };
}

/** Expected canonical text, written independently of the implementation. */
function canon(node: Node): string {
  switch (node.k) {
    case 'lit': return node.text;
    case 'num': return node.lexeme;
    case 'str': return JSON.stringify(node.value);
    case 'arr': return `[${node.items.map(canon).join(',')}]`;
    case 'obj': {
      const last = new Map<string, Node>();
      for (const [key, v] of node.entries) { last.delete(key); last.set(key, v); }
      const keys = [...last.keys()].sort((x, y) => (x < y ? -1 : x > y ? 1 : 0));
      return `{${keys.map((key) => `${JSON.stringify(key)}:${canon(last.get(key) as Node)}`).join(',')}}`;
    }
  }
}

const ESCAPES: Record<string, string> = { '"': '\\"', '\\': '\\\\', '\n': '\\n', '\t': '\\t', '\b': '\\b', '\f': '\\f', '\r': '\\r', '/': '\\/' };
const hex4 = (c: number, upper: boolean) => {
  const h = c.toString(16).padStart(4, '0');
  return '\\u' + (upper ? h.toUpperCase() : h);
};

/** Some valid JSON spelling of a string: escapes chosen at random where JSON allows a choice. */
function spellString(rnd: Rnd, value: string): string {
  let out = '"';
  for (const ch of value.split('')) {
    const c = ch.charCodeAt(0);
    const mustEscape = ch === '"' || ch === '\\' || c < 0x20;
    if (rnd() < 0.25) out += hex4(c, rnd() < 0.5);
    else if (ESCAPES[ch] !== undefined && (mustEscape || rnd() < 0.5)) out += ESCAPES[ch];
    else if (mustEscape) out += hex4(c, false);
    else out += ch;
  }
  return out + '"';
}

interface Spelling { ws: boolean; shuffle: boolean; escapes: boolean }

function ws(rnd: Rnd, on: boolean): string {
  return on && rnd() < 0.5 ? pick(rnd, [' ', '\n', '\t', '\r\n  ', '  ']) : '';
}

/** Renders a tree as JSON text; with `shuffle`, object members are reordered but the
 * last occurrence of each duplicated key stays after the earlier ones. */
function render(rnd: Rnd, node: Node, sp: Spelling): string {
  const w = () => ws(rnd, sp.ws);
  const str = (s: string) => (sp.escapes ? spellString(rnd, s) : JSON.stringify(s));
  switch (node.k) {
    case 'lit': return node.text;
    case 'num': return node.lexeme;
    case 'str': return str(node.value);
    case 'arr': return `[${w()}${node.items.map((n) => w() + render(rnd, n, sp) + w()).join(',')}${w()}]`;
    case 'obj': {
      let entries = node.entries;
      if (sp.shuffle) {
        const lastIndex = new Map(entries.map(([key], i) => [key, i]));
        const finals = entries.filter((_, i) => lastIndex.get(entries[i][0]) === i).sort(() => rnd() - 0.5);
        const dropped = entries.filter((_, i) => lastIndex.get(entries[i][0]) !== i);
        entries = [...dropped, ...finals]; // earlier duplicates first, so the same one still wins
      }
      const body = entries.map(([key, n]) => `${w()}${str(key)}${w()}:${w()}${render(rnd, n, sp)}${w()}`).join(',');
      return `{${body}${w()}}`;
    }
  }
}

/** Plain JS value with numbers as JS numbers, to compare against JSON.parse. */
function toPlain(v: JsonValue): unknown {
  if (v instanceof JsonNumber) return Number(v.lexeme);
  if (Array.isArray(v)) return v.map(toPlain);
  if (v !== null && typeof v === 'object') {
    const out: Record<string, unknown> = {};
    for (const key of Object.keys(v)) Object.defineProperty(out, key, { value: toPlain(v[key]), enumerable: true, writable: true, configurable: true });
    return out;
  }
  return v;
}

function expectMalformed(text: string): CanonicalJsonError {
  try {
    parseCanonical(text);
  } catch (e) {
    expect(e, JSON.stringify(text)).to.be.instanceOf(CanonicalJsonError);
    return e as CanonicalJsonError;
  }
  expect.fail(`parsed malformed ${JSON.stringify(text)}`);
}

const CASES = 2000;
const hashOf = (canonicalText: string) => identityHash({ dialect: 'chat', canonicalText });

describe('canonical-json', () => {
  describe('random documents', () => {
    it('canonical text matches an independent model and ignores whitespace, key order and escapes', () => {
      const rnd = prng(1);
      for (let i = 0; i < CASES; i++) {
        const node = randomNode(rnd, 4);
        const expected = canon(node);
        const plain = render(rnd, node, { ws: false, shuffle: false, escapes: false });
        const fancy = render(rnd, node, { ws: true, shuffle: true, escapes: true });
        const a = parseCanonical(plain);
        const b = parseCanonical(fancy);
        expect(a.text, plain).to.equal(expected);
        expect(b.text, fancy).to.equal(expected);
        expect(hashOf(b.text)).to.equal(hashOf(a.text));
      }
    });

    it('ignores whitespace at every place JSON allows it', () => {
      const rnd = prng(7);
      for (let i = 0; i < CASES / 10; i++) {
        const expected = canon(randomNode(rnd, 3));
        let inString = false;
        for (let at = 0; at <= expected.length; at++) {
          if (!inString) {
            const spaced = expected.slice(0, at) + pick(rnd, [' ', '\n', '\r', '\t']) + expected.slice(at);
            let valid = true;
            try { JSON.parse(spaced); } catch { valid = false; }
            if (valid) expect(parseCanonical(spaced).text, spaced).to.equal(expected);
          }
          if (expected[at] === '\\') at++;
          else if (expected[at] === '"') inString = !inString;
        }
      }
    });

    it('canonical text re-parses to what JSON.parse gives for the original, and is a fixed point', () => {
      const rnd = prng(2);
      for (let i = 0; i < CASES; i++) {
        const text = render(rnd, randomNode(rnd, 4), { ws: true, shuffle: false, escapes: true });
        const { value, text: canonical } = parseCanonical(text);
        const original = JSON.parse(text);
        expect(JSON.parse(canonical), text).to.deep.equal(original);
        expect(toPlain(value), text).to.deep.equal(original);
        expect(parseCanonical(canonical).text).to.equal(canonical);
        expect(stringifyCanonical(value)).to.equal(canonical);
      }
    });

    it('numeric spelling, big integers and array order change the canonical text and hash', () => {
      const rnd = prng(3);
      const pairs = [['1', '1.0'], ['1e2', '100'], ['0', '-0'], ['12345678901234567890', '12345678901234567891'], ['1e2', '1E2']];
      for (let i = 0; i < CASES / 4; i++) {
        const [x, y] = pick(rnd, pairs);
        const other = render(rnd, randomNode(rnd, 3), { ws: false, shuffle: false, escapes: false });
        const a = parseCanonical(`{"v":${x},"o":${other}}`).text;
        const b = parseCanonical(`{"o":${other},"v":${y}}`).text;
        expect(a).to.not.equal(b);
        expect(hashOf(a)).to.not.equal(hashOf(b));
        if (parseCanonical(other).text === x) continue;
        const swapped = parseCanonical(`[${other},${x}]`).text;
        expect(parseCanonical(`[${x},${other}]`).text).to.not.equal(swapped);
      }
    });

    it('accepts exactly what JSON.parse accepts under random single-character damage', () => {
      const rnd = prng(4);
      const junk = ['', ',', '"', '\\', '}', ']', '{', '[', ':', '0', '-', '.', 'e', 'x', ' ', '\u0001', "'", 'n'];
      for (let i = 0; i < CASES; i++) {
        const text = render(rnd, randomNode(rnd, 3), { ws: true, shuffle: false, escapes: true });
        const at = int(rnd, text.length + 1);
        const damaged = text.slice(0, at) + pick(rnd, junk) + text.slice(at + int(rnd, 2));
        let valid = true;
        try { JSON.parse(damaged); } catch { valid = false; }
        if (valid) expect(JSON.parse(parseCanonical(damaged).text), damaged).to.deep.equal(JSON.parse(damaged));
        else expectMalformed(damaged);
      }
    });
  });

  describe('strings', () => {
    it('re-emit exactly what JSON.stringify gives, whatever the spelling', () => {
      const rnd = prng(5);
      for (let i = 0; i < CASES; i++) {
        const s = randomString(rnd, 12);
        const { value, text } = parseCanonical(spellString(rnd, s));
        expect(value).to.equal(s);
        expect(text).to.equal(JSON.stringify(s));
      }
    });

    it('escape lone surrogates written raw and keep valid pairs raw', () => {
      expect(parseCanonical('"a\ud800b"').text).to.equal('"a\\ud800b"');
      expect(parseCanonical('["\udc00",{"k":"\\uD83D\\uDE42"}]').text).to.equal('["\\udc00",{"k":"🙂"}]');
      expect(parseCanonical('"\\/\\u0041\\u00E9"').text).to.equal('"/Aé"');
    });
  });

  describe('objects', () => {
    it('keep the last of duplicated keys, like JSON.parse', () => {
      const { value, text } = parseCanonical('{"a":1,"b":[1],"a":{"x":2},"b":true}');
      expect(text).to.equal('{"a":{"x":2},"b":true}');
      expect(toPlain(value)).to.deep.equal({ a: { x: 2 }, b: true });
      expect(parseCanonical('{"a":1,"a":2}').text).to.equal('{"a":2}');
    });

    it('sort and de-duplicate large objects like small ones', () => {
      const rnd = prng(6);
      for (let i = 0; i < 200; i++) {
        const entries: [string, Node][] = Array.from({ length: 10 + int(rnd, 60) }, () =>
          [randomString(rnd, 3), { k: 'num', lexeme: String(int(rnd, 100)) }]);
        const node: Node = { k: 'obj', entries };
        expect(parseCanonical(render(rnd, node, { ws: true, shuffle: true, escapes: true })).text).to.equal(canon(node));
      }
    });

    it('sort keys by UTF-16 code units, not locale', () => {
      expect(parseCanonical('{"b":0,"a":0,"B":0,"é":0,"\uff5e":0,"🙂":0,"10":0,"9":0}').text)
        .to.equal('{"10":0,"9":0,"B":0,"a":0,"b":0,"é":0,"🙂":0,"\uff5e":0}');
    });

    it('keep "__proto__" as an ordinary own member', () => {
      const { value, text } = parseCanonical('{"__proto__":{"polluted":true},"a":1}');
      expect(text).to.equal('{"__proto__":{"polluted":true},"a":1}');
      expect(Object.getPrototypeOf(value)).to.equal(Object.prototype);
      expect(Object.keys(value as object)).to.deep.equal(['__proto__', 'a']);
      expect(({} as Record<string, unknown>).polluted).to.equal(undefined);
    });
  });

  describe('malformed input', () => {
    const bad = ['', ' ', '\ufeff{}', '{"a":1,}', '[1,]', "{'a':1}", "'a'", 'NaN', '[Infinity]', '-', '01', '1.', '.5',
      '1e', '+1', '"abc', '"a\\"', '{"a":1} x', '{}{}', '{"a" 1}', '{"a":}', '{a:1}', '[1 2]', 'tru', 'nulll',
      '"\u0001"', '"tab\there"', '"\\x41"', '"\\u12"', '"\\u12G4"', '[', '{', '{"a":1', '"\\', '0x10', '\u00a0[]'];
    for (const text of bad) {
      it(`rejects ${JSON.stringify(text)}`, () => {
        expect(() => JSON.parse(text), 'the fixture itself must be invalid JSON').to.throw(SyntaxError);
        expectMalformed(text);
      });
    }

    it('reports a position', () => {
      expect(expectMalformed('{"a":1,}').position).to.equal(7);
      expect(expectMalformed('[1,2] 3').message).to.match(/position 6/);
    });

    it('refuses nesting past the limit but accepts deep realistic nesting', () => {
      expect(parseCanonical('['.repeat(400) + ']'.repeat(400)).text).to.have.length(800);
      expectMalformed('['.repeat(100000) + ']'.repeat(100000));
    });
  });

  describe('top-level helpers', () => {
    const body = parseCanonical('{"stream":true,"model":"gpt-x","n":1,"messages":[{"role":"user","content":"hi"}]}');

    it('rewrite one field without touching the input', () => {
      const before = JSON.stringify(toPlain(body.value));
      const out = withTopLevelField(body.value, 'model', jsonString('other'));
      expect(out).to.equal('{"messages":[{"content":"hi","role":"user"}],"model":"other","n":1,"stream":true}');
      expect(JSON.stringify(toPlain(body.value))).to.equal(before);
      expect(topLevelString(body.value, 'model')).to.equal('gpt-x');
      expect(withTopLevelField(body.value, 'a', jsonNumber('1.0'))).to.match(/^\{"a":1\.0,"messages"/);
      expect(() => withTopLevelField(parseCanonical('[]').value, 'model', 'x')).to.throw(TypeError);
    });

    it('read string and boolean fields only when they have that type', () => {
      expect(topLevelString(body.value, 'model')).to.equal('gpt-x');
      expect(topLevelString(body.value, 'stream')).to.equal(undefined);
      expect(topLevelBoolean(body.value, 'stream')).to.equal(true);
      expect(topLevelBoolean(body.value, 'n')).to.equal(undefined);
      expect(topLevelString(parseCanonical('["model"]').value, '0')).to.equal(undefined);
      expect(topLevelString(body.value, 'toString')).to.equal(undefined);
    });

    it('build numbers only from valid lexemes', () => {
      expect(isJsonNumber(jsonNumber('-0.5e+3'))).to.equal(true);
      expect(Object.isFrozen(jsonNumber('1'))).to.equal(true);
      for (const lexeme of ['1.', '01', 'NaN', '', ' 1']) expect(() => jsonNumber(lexeme)).to.throw(TypeError);
    });
  });

  describe('identityHash', () => {
    it('is a stable hex SHA-256 that depends on every part', () => {
      const base = { dialect: 'chat', canonicalText: '{"a":1}' };
      const h = identityHash(base);
      expect(h).to.match(/^[0-9a-f]{64}$/);
      expect(identityHash({ ...base })).to.equal(h);
      expect(identityHash({ ...base, dialect: 'messages' })).to.not.equal(h);
      expect(identityHash({ ...base, canonicalText: '{"a":2}' })).to.not.equal(h);
      expect(identityHash({ ...base, credentialHash: 'k1' })).to.not.equal(h);
      expect(identityHash({ ...base, credentialHash: 'k1' })).to.not.equal(identityHash({ ...base, credentialHash: 'k2' }));
    });

    it('does not collide when a boundary between parts moves', () => {
      const hashes = [
        identityHash({ dialect: 'chat', canonicalText: 'x' }),
        identityHash({ dialect: 'chatx', canonicalText: '' }),
        identityHash({ dialect: 'chat', canonicalText: 'x', credentialHash: '' }),
        identityHash({ dialect: 'chat', canonicalText: '', credentialHash: 'x' }),
        identityHash({ dialect: 'chat', canonicalText: '1:x' }),
        identityHash({ dialect: 'chat', canonicalText: '-' }),
      ];
      expect(new Set(hashes).size).to.equal(hashes.length);
    });
  });
});
