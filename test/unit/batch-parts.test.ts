// The pure parts of batches (docs/api.md "Batches"): the streaming multipart reader and line
// splitter hold nothing but a delimiter's worth of bytes whatever the chunking, a line is
// checked as the vendor's format says, and a stored answer goes into a result unchanged.
import { expect } from 'chai';
import { createMultipartReader, multipartBoundary, type MultipartEvent } from '../../src/core/batch-multipart.ts';
import { createLineSplitter, checkOpenAILine, isLineError, windowMs } from '../../src/core/batch-lines.ts';
import { answerJson, openaiResultLine, anthropicResultLine, type EndedLine } from '../../src/core/batch-shapes.ts';

const BODY = (file: string) =>
  `--XyZ\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--XyZ\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\nContent-Type: application/octet-stream\r\n\r\n${file}\r\n--XyZ--\r\n`;

function read(body: Buffer, size: number): { fields: Record<string, string>; filename: string | null; ended: boolean } {
  const reader = createMultipartReader('XyZ');
  const events: MultipartEvent[] = [];
  for (let at = 0; at < body.length; at += size) events.push(...reader.feed(body.subarray(at, at + size)));
  reader.finish();
  const fields: Record<string, string> = {};
  let part = '';
  let filename: string | null = null;
  for (const e of events) {
    if (e.type === 'part') {
      part = e.name;
      if (e.filename) filename = e.filename;
      fields[part] = '';
    } else if (e.type === 'data') fields[part] += e.data.toString('utf8');
  }
  return { fields, filename, ended: events.at(-1)?.type === 'end' };
}

describe('batch parts', () => {
  it('the multipart reader gives the same parts whatever the chunking, a delimiter split across chunks included', () => {
    // A file whose content holds near-delimiters (CRLF, dashes, the boundary without its CRLF).
    const file = '{"a":1}\r\n--Xy\r\n-- XyZ\r\n{"b":"--XyZ"}';
    const body = Buffer.from(BODY(file));
    for (const size of [1, 2, 3, 7, 64, body.length]) {
      const got = read(body, size);
      expect(got.fields, `chunks of ${size}`).to.deep.equal({ purpose: 'batch', file });
      expect(got.filename).to.equal('in.jsonl');
      expect(got.ended).to.equal(true);
    }
    expect(multipartBoundary('multipart/form-data; boundary=----abc')).to.equal('----abc');
    expect(multipartBoundary('application/json')).to.equal(null);
    expect(() => createMultipartReader('XyZ').finish()).to.throw(/ended before/);
  });

  it('the line splitter gives each line once, LF or CRLF, whatever the chunking', () => {
    const text = 'one\r\ntwo\n\nthree';
    for (const size of [1, 2, 5, text.length]) {
      const s = createLineSplitter();
      const lines: string[] = [];
      for (let at = 0; at < text.length; at += size) lines.push(...s.feed(Buffer.from(text.slice(at, at + size))).map(String));
      lines.push(...s.finish().map(String));
      expect(lines, `chunks of ${size}`).to.deep.equal(['one', 'two', '', 'three']);
    }
  });

  it('a line is checked as the vendor says; a body Sarsen would refuse is kept as a refusal of that line', () => {
    const ok = checkOpenAILine(Buffer.from('{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"m","n":1.0}}'), 1, '/v1/chat/completions', 100);
    expect(ok).to.deep.equal({ line: 1, customId: 'a', model: 'm', body: '{"model":"m","n":1.0}', refusal: null });
    const big = checkOpenAILine(Buffer.from(`{"custom_id":"b","method":"POST","url":"/v1/chat/completions","body":{"model":"m","x":"${'y'.repeat(200)}"}}`), 2, '/v1/chat/completions', 100);
    expect(!isLineError(big) && big.refusal).to.deep.include({ code: 'body_too_large', status: 413 });
    const codes = ['{', '[]', '{"method":"POST"}', '{"custom_id":"c","method":"GET","url":"/v1/chat/completions","body":{}}', '{"custom_id":"c","method":"POST","url":"/v1/responses","body":{}}', '{"custom_id":"c","method":"POST","url":"/v1/chat/completions","body":1}', '{"custom_id":"c\\u0000","method":"POST","url":"/v1/chat/completions","body":{}}']
      .map((l, i) => checkOpenAILine(Buffer.from(l), i + 1, '/v1/chat/completions', 100))
      .map((r) => (isLineError(r) ? r.code : 'ok'));
    expect(codes).to.deep.equal(['invalid_json_line', 'invalid_json_line', 'missing_required_parameter', 'invalid_method', 'mismatched_endpoint', 'invalid_request', 'invalid_custom_id']);
    expect([windowMs('24h'), windowMs('90s'), windowMs('25h'), windowMs('1d'), windowMs(24)]).to.deep.equal([86_400_000, 90_000, null, null, null]);
  });

  it('a stored answer goes into its result byte for byte, one line', () => {
    const answer = Buffer.from('{ "z":1,  "a":[1.0, 2e3] ,"s":"\\u00e9"}');
    expect(answerJson(answer)).to.equal(answer.toString());
    expect(answerJson(Buffer.from('{\n  "a": 1\r\n}'))).to.equal('{  "a": 1}');
    expect(answerJson(Buffer.from('not json'))).to.equal('"not json"');
    const line: EndedLine = { line: 3, custom_id: 'q"1', state: 'succeeded', request_id: 'req_1', error_code: null, error_status: null, error_message: null, answer_status: 200, answer, swept: false };
    expect(openaiResultLine('batch_X', line)).to.equal(`{"id":"batch_req_X_3","custom_id":"q\\"1","response":{"status_code":200,"request_id":"req_1","body":${answer}},"error":null}\n`);
    expect(anthropicResultLine(line)).to.equal(`{"custom_id":"q\\"1","result":{"type":"succeeded","message":${answer}}}\n`);
    expect(anthropicResultLine({ ...line, state: 'canceled', answer: null })).to.equal('{"custom_id":"q\\"1","result":{"type":"canceled"}}\n');
    // A failure Sarsen stored itself is told in the vendor's shape; a provider's refusal verbatim.
    const own = Buffer.from('{"error":{"code":"upstream_failed","message":"The provider could not be reached."}}');
    expect(anthropicResultLine({ ...line, state: 'failed', answer_status: 502, answer: own })).to.equal(
      '{"custom_id":"q\\"1","result":{"type":"errored","error":{"type":"error","error":{"type":"api_error","message":"The provider could not be reached.","code":"upstream_failed"}}}}\n');
    const theirs = Buffer.from('{"type":"error","error":{"type":"overloaded_error","message":"busy"}}');
    expect(anthropicResultLine({ ...line, state: 'failed', answer_status: 529, answer: theirs })).to.equal(`{"custom_id":"q\\"1","result":{"type":"errored","error":${theirs}}}\n`);
  });
});
