-- Up Migration

-- Stream frames, packed: a row holds the frames one chunk-writer flush stored for one attempt,
-- back to back in `frames`, with `frame_lengths` giving each frame's length (NULL: the row holds
-- one frame) and `last_seq` the sequence number of the last of them (the first is last_seq minus
-- the count plus one). A busy stream's frames share a row, its index entry and its row lock, so
-- storing frames costs per flush and stream, not per frame. Rows of one request never overlap,
-- so (request_id, last_seq) orders them as it ordered single frames.
ALTER TABLE sarsen.chunks RENAME COLUMN seq TO last_seq;
ALTER TABLE sarsen.chunks RENAME COLUMN frame TO frames;
ALTER TABLE sarsen.chunks ADD COLUMN frame_lengths integer[];
