-- Up Migration

-- Stream frames stored as differences (issue 62: WAL a frame halved; docs/storage.md "How frames
-- are stored"). A row written from now on holds each frame behind a marker byte, whole or as the
-- difference from the frame before it in the same attempt (src/core/frame-delta.ts), and
-- `frame_lengths` gives the stored lengths. `bytes` is the frames' own bytes, which storage counts
-- (GET /storage and a request's stored_bytes are unchanged by the encoding). A row with `bytes`
-- NULL was written before this migration, or by a process of the release before while this one
-- starts: it holds its frames whole, without markers, and octet_length(frames) is its bytes.
-- Adding a nullable column rewrites nothing.
ALTER TABLE sarsen.chunks ADD COLUMN bytes integer;
