export const mochaHooks = {};
