// An OTLP/HTTP receiver that takes every export and keeps nothing, for measuring what tracing costs
// Sarsen (docs/performance.md "Costs measured in isolation"): `node bench/lib/otlp-sink.ts [port]`,
// then run a benchmark with --child-env OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:<port>. It
// prints the spans' bytes and exports received when stopped.
import http from 'node:http';

const port = Number(process.argv[2] ?? 4318);
let exports = 0;
let bytes = 0;
const server = http.createServer((req, res) => {
  req.on('data', (c: Buffer) => (bytes += c.length));
  req.on('end', () => {
    exports++;
    res.writeHead(200, { 'content-type': req.headers['content-type'] ?? 'application/x-protobuf' }).end();
  });
});
server.listen(port, '127.0.0.1', () => process.stderr.write(`[otlp-sink] listening on http://127.0.0.1:${port}\n`));
const stop = () => {
  process.stderr.write(`[otlp-sink] ${exports} exports, ${bytes} bytes\n`);
  process.exit(0);
};
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
