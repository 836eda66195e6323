-- P6: reception ids are drawn a block at a time, one nextval per 1,000 receptions instead of
-- one per reception (each cost the server ~1.5 µs, bench_store). The ingest gives a batch's
-- receptions consecutive ids inside its blocks (dlrfeed.store.queries.RECEPTION_ID_BLOCK must
-- equal this increment; a test holds them together). Ids stay unique and, within a batch,
-- follow the batch order; blocks leave gaps, as a sequence always may. A dlrfeed of before
-- this migration takes one id per nextval: its ids are block starts, so never collide.
ALTER SEQUENCE dlr.receptions_id_seq INCREMENT BY 1000;
