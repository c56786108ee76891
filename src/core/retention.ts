// Effective retention (docs/accounting.md "Retention"): the horizon the sweep applies to a
// namespace's records, in minutes.
//   1. the namespace's own value when it names one (0 included: "keep everything");
//   2. else its tenancy's value;
//   3. unset or 0 means "as long as the deployment keeps the metadata": the metadata horizon;
//   4. any other value is silently clamped to the metadata horizon.

export type RetentionInputs = Readonly<{
  namespaceMinutes: number | null;
  tenancyMinutes: number | null;
  metadataHorizonMinutes: number;
}>;

export function effectiveRetentionMinutes(inputs: RetentionInputs): number {
  const { namespaceMinutes, tenancyMinutes, metadataHorizonMinutes } = inputs;
  const named = namespaceMinutes ?? tenancyMinutes;
  if (named === null || named === 0) return metadataHorizonMinutes;
  return Math.min(named, metadataHorizonMinutes);
}
