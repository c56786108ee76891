import { expect } from 'chai';
describe('smoke', () => { it('runs', () => { expect(1).to.equal(1); }); });
