// The pure parts of background responses (src/core/background.ts, docs/api.md "Background responses").
import { expect } from 'chai';
import { upstreamBody, answerResponseId, frameResponseId, frameSequence, terminalResponse, inputItems, errorEvent } from '../../src/core/background.ts';
import { openaiErrorBody } from '../../src/core/vendor-api.ts';

describe('background responses (pure)', () => {
  it('upstreamBody removes a top-level background, whatever its value, and nothing else', () => {
    expect(upstreamBody('{"background":true,"input":"x","model":"m"}')).to.equal('{"input":"x","model":"m"}');
    expect(upstreamBody('{"background":false,"metadata":{"background":"true"},"model":"m","temperature":1.0}')).to.equal('{"metadata":{"background":"true"},"model":"m","temperature":1.0}');
    const untouched = '{"input":"\\"background\\":true","model":"m"}';
    expect(upstreamBody(untouched)).to.equal(untouched);
    expect(upstreamBody('{"model":"m"}')).to.equal('{"model":"m"}');
  });

  it('reads the provider\'s response id from an answer and from a stream\'s response.created', () => {
    expect(answerResponseId(Buffer.from('{"id":"resp_1","object":"response"}'))).to.equal('resp_1');
    expect(answerResponseId(Buffer.from('{"object":"response","id":"resp_2"}'))).to.equal('resp_2');
    expect(answerResponseId(Buffer.from('not json'))).to.equal(null);
    expect(frameResponseId(Buffer.from('event: response.created\ndata: {"type":"response.created","response":{"id":"resp_3","object":"response"},"sequence_number":0}\n\n'))).to.equal('resp_3');
    expect(frameResponseId(Buffer.from('event: response.created\ndata: {"response":{"object":"response","id":"resp_4"}}\n\n'))).to.equal('resp_4');
    expect(frameResponseId(Buffer.from('event: response.output_text.delta\ndata: {"delta":"x"}\n\n'))).to.equal(null);
  });

  it('numbers a frame by its sequence_number, never by text the model wrote', () => {
    expect(frameSequence('data: {"type":"response.output_text.delta","delta":"a","sequence_number":12}\n\n')).to.equal(12);
    expect(frameSequence('data: {"type":"response.output_text.delta","delta":"\\"sequence_number\\":3"}\n\n')).to.equal(null);
  });

  it('takes a terminal event\'s response byte for byte, and nothing from other events', () => {
    const response = '{"id":"resp_5", "status":"completed","temperature":1.0}';
    expect(terminalResponse(`event: response.completed\ndata: {"type":"response.completed","response":${response},"sequence_number":9}\n\n`)).to.equal(response);
    expect(terminalResponse(`event: response.incomplete\ndata: {"type":"response.incomplete","response":${response}}\n\n`)).to.equal(response);
    expect(terminalResponse(`event: response.created\ndata: {"type":"response.created","response":${response}}\n\n`)).to.equal(null);
  });

  it('lists input items in the vendor\'s shape, each with an id', () => {
    const body = { input: [{ role: 'user', content: 'hi' }, { type: 'message', id: 'msg_own', role: 'user', content: [{ type: 'input_text', text: 'there' }] }] } as any;
    const items = inputItems(body, 'req_01ABC');
    expect(items[0]).to.deep.equal({ type: 'message', role: 'user', content: [{ type: 'input_text', text: 'hi' }], id: 'msg_01ABC_0', status: 'completed' });
    expect(items[1]!.id).to.equal('msg_own');
    expect(inputItems({ input: 'plain' } as any, 'req_X')).to.have.length(1);
  });

  it('writes the vendor\'s error body and error event', () => {
    expect(JSON.parse(openaiErrorBody('not_found', 404, 'gone'))).to.deep.equal({ error: { message: 'gone', type: 'not_found_error', param: null, code: 'not_found' } });
    expect(errorEvent('response_superseded', 'm', 7)).to.equal('event: error\ndata: {"type":"error","code":"response_superseded","message":"m","param":null,"sequence_number":7}\n\n');
  });
});
