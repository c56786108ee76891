// `sarsen batch run` reads each line's body as written: the substring of the `body` value,
// never a re-serialisation (src/core/json-span.ts).
import { expect } from 'chai';
import { readBatch } from '../../src/cli/batch.ts';
import { topLevelValueSpan } from '../../src/core/json-span.ts';

const span = (text: string, key: string) => {
  const s = topLevelValueSpan(text, key);
  return s && text.slice(...s);
};

describe('batch lines', () => {
  it('finds a top-level member\'s value exactly as written, whatever it holds', () => {
    expect(span('{"a":1,"body":{"x":1.0}}', 'body')).to.equal('{"x":1.0}');
    expect(span(' { "body" :\t{ "z" : 1e2 , "a" : [ 1 , {"}":"]"} ] }\r', 'body')).to.equal('{ "z" : 1e2 , "a" : [ 1 , {"}":"]"} ] }');
    expect(span('{"custom_id":"a\\"body\\":","body":{"s":"caf\\u00e9 \\\\\\" {"}}', 'body')).to.equal('{"s":"caf\\u00e9 \\\\\\" {"}');
    expect(span('{"body":[],"n":-0.5e-3}', 'n')).to.equal('-0.5e-3');
    expect(span('{"body":null,"t":true}', 't')).to.equal('true');
    // Keys compared decoded; the last of a repeated key wins, as with JSON.parse.
    expect(span('{"\\u0062ody":{"first":1},"body":{"last":2}}', 'body')).to.equal('{"last":2}');
    expect(span('{"\\u0062ody":{"only":1}}', 'body')).to.equal('{"only":1}');
    expect(span('{"nobody":{}}', 'body')).to.equal(null);
    expect(span('{}', 'body')).to.equal(null);
  });

  it('each line\'s body is the bytes of its body value: number spellings, key order, escapes and whitespace kept', () => {
    const bodies = [
      '{"model":"gpt-test","temperature":1.0,"max_tokens":1e2,"seed":12345678901234567890,"messages":[{"role":"user","content":"caf\\u00e9 \\ud83d\\/"}]}',
      '{ "messages" : [ { "content" : "spaced" , "role" : "user" } ] , "model" : "gpt-test" , "stream" : true }',
    ];
    const text = `{"custom_id":"a","body":${bodies[0]}}\r\n{"body": ${bodies[1]} ,"custom_id":"b","method":"POST"}\n`;
    const { lines, problems } = readBatch(text, 'chat');
    expect(problems).to.deep.equal([]);
    expect(lines).to.deep.equal([
      { line: 1, customId: 'a', body: bodies[0], streaming: false },
      { line: 2, customId: 'b', body: bodies[1], streaming: true },
    ]);
  });
});
