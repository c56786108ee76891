// Every router the API role serves, in mount order. The executor role serves health only.
import type { Router } from 'express';
import type { Deps } from '../deps.ts';

export function apiRouters(_deps: Deps): Router[] {
  return [];
}
