-- 002: the publication, created by an owner so that wal2iceberg itself
-- never needs to own the tables. Idempotent. It starts empty; add the
-- tables with wal2iceberg setup --tables ..., or by hand:
--   ALTER PUBLICATION wal2iceberg ADD TABLE public.customers;
-- Only tables with a primary key or a replica identity may be added: a
-- published table without one refuses UPDATE and DELETE.
-- The comment marks it as wal2iceberg's, so wal2iceberg teardown may drop it.

DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'wal2iceberg') THEN
    CREATE PUBLICATION wal2iceberg WITH (publish_via_partition_root = true);
    COMMENT ON PUBLICATION wal2iceberg IS 'created by wal2iceberg';
  END IF;
END
$$;
