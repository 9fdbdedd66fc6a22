-- 003: wal2iceberg's publication publishes a partitioned table's changes as
-- the partitioned table's (publish_via_partition_root), so that a
-- partitioned table captured by name becomes one Iceberg table holding all
-- its partitions. Idempotent; touches only the publication 002 created
-- (marked by its comment), whose partitioned tables could not be captured
-- before this setting.

DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_publication
             WHERE pubname = 'wal2iceberg' AND NOT pubviaroot
               AND obj_description(oid, 'pg_publication') = 'created by wal2iceberg') THEN
    ALTER PUBLICATION wal2iceberg SET (publish_via_partition_root = true);
  END IF;
END
$$;
