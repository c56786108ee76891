// What every submission body must name, wherever it arrives (docs/api.md "What happens to a
// submission"): a route refuses the call, a batch keeps the line and ends it refused, each with
// these words.
import { isJsonObject, topLevelString, type JsonValue } from './canonical-json.ts';

/** The body's `model`, or why Sarsen answers the body `400 bad_request`. */
export function bodyModel(value: JsonValue): { model: string } | { refused: string } {
  if (!isJsonObject(value)) return { refused: 'The body must be a JSON object.' };
  const model = topLevelString(value, 'model');
  if (model === undefined) return { refused: 'The body must name a `model` as a string.' };
  // The model is stored as text, which cannot hold U+0000 (the body keeps its escape as sent).
  if (model.includes('\u0000')) return { refused: 'The `model` must not contain U+0000.' };
  return { model };
}
