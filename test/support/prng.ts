// A seeded pseudo-random generator (mulberry32) for fuzzed tests and benchmark inputs: a failing
// run is reproduced from its seed, and every benchmark run measures the same inputs.
export type Rnd = () => number;

export function prng(seed: number): Rnd {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
