// The request events' wire format (src/db/events.ts): what the bus makes of a NOTIFY payload.
// The SQL encoder is exercised end to end by the streaming and cross-process tests.
import { expect } from 'chai';
import { decodeRequestEvents } from '../../src/db/events.ts';

describe('request events on the wire', () => {
  it('decodes frames, states and superseded events, in order', () => {
    const payload = 'R wrk_other [["req_a","f","7"],["req_b","s","succeeded"],["req_c","x",null],["req_a","f","9"]]';
    expect(decodeRequestEvents(payload, 'wrk_self')).to.deep.equal([
      { type: 'frames', requestId: 'req_a', seq: 7 },
      { type: 'state', requestId: 'req_b', status: 'succeeded' },
      { type: 'superseded', requestId: 'req_c' },
      { type: 'frames', requestId: 'req_a', seq: 9 },
    ]);
  });

  it('drops its own echo without reading it: the producer delivered those events in memory', () => {
    expect(decodeRequestEvents('R wrk_self [["req_a","f","7"]]', 'wrk_self')).to.deep.equal([]);
    expect(decodeRequestEvents('R wrk_self not even json', 'wrk_self')).to.deep.equal([]);
  });

  it('leaves control messages (JSON objects) to the bus', () => {
    expect(decodeRequestEvents('{"k":"settings"}', 'wrk_self')).to.equal(null);
    expect(decodeRequestEvents('{"k":"routing","namespace_id":"ns_1"}', 'wrk_self')).to.equal(null);
  });

  it('skips what it does not understand instead of delivering it', () => {
    const payload = 'R wrk_other [["req_a","f","x"],["req_b","s","exploded"],["req_c","?",1],[1,"f","2"],"junk",["req_d","s","failed"]]';
    expect(decodeRequestEvents(payload, 'wrk_self')).to.deep.equal([{ type: 'state', requestId: 'req_d', status: 'failed' }]);
    expect(decodeRequestEvents('R wrk_other {"not":"a list"}', 'wrk_self')).to.deep.equal([]);
    expect(decodeRequestEvents('R wrk_other [[', 'wrk_self')).to.deep.equal([]);
  });
});
