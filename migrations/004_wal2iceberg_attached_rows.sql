-- 004: the rows a partition already holds when it is attached to a
-- partitioned table published via its root never pass through the WAL as
-- changes of that table. This event trigger writes each of them into the
-- attaching transaction as a transactional logical message
-- (pg_logical_emit_message, prefix wal2iceberg.attached_row), so that
-- wal2iceberg sees them at the attach's exact place in the stream.
--
-- An event trigger needs a superuser: run as another role, this file only
-- says so (wal2iceberg then refuses partitioned tables, naming this file).
-- Idempotent. `wal2iceberg teardown` leaves it, since other runs may rely on
-- it; DROP EVENT TRIGGER wal2iceberg_attached_rows; DROP SCHEMA wal2iceberg
-- CASCADE; removes it. The function runs as its owner, reads only catalogs
-- and the attached partition, and writes only the messages.

DO $$
BEGIN
  IF NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
    RAISE NOTICE 'not a superuser: the event trigger wal2iceberg_attached_rows is not installed';
    RETURN;
  END IF;
  CREATE SCHEMA IF NOT EXISTS wal2iceberg;
  COMMENT ON SCHEMA wal2iceberg IS 'created by wal2iceberg';
  -- The session settings are those of wal2iceberg's own connections, so
  -- that each value's text is what pgoutput would send for it.
  CREATE OR REPLACE FUNCTION wal2iceberg.emit_attached_rows() RETURNS event_trigger
  LANGUAGE plpgsql SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
  SET DateStyle = 'ISO' SET TimeZone = 'UTC' SET IntervalStyle = 'iso_8601'
  SET extra_float_digits = 3 SET bytea_output = 'hex'
  AS $fn$
  DECLARE
    top bigint := pg_current_xact_id()::text::bigint;
    -- Partitions this transaction created or already sent, as a list of oids.
    done text := coalesce(current_setting('wal2iceberg.attached', true), '');
    attached record;
    target record;
    fields text;
    mine boolean;
  BEGIN
    FOR attached IN
      SELECT DISTINCT i.inhrelid AS child, i.inhparent AS parent,
             (top >> 32 << 32) | i.xmin::text::bigint AS writer
      FROM pg_event_trigger_ddl_commands() c
      JOIN pg_inherits i ON i.inhparent = c.objid OR i.inhrelid = c.objid
      WHERE c.classid = 'pg_class'::regclass
    LOOP
      -- Only pg_inherits rows this transaction wrote, in any subtransaction:
      -- visible, and written by a transaction still in progress. (A raw
      -- xmin of an earlier epoch reads as the future, which is an error.)
      CONTINUE WHEN attached.writer < top;
      BEGIN
        mine := pg_xact_status(attached.writer::text::xid8) = 'in progress';
      EXCEPTION WHEN OTHERS THEN
        mine := false;
      END;
      CONTINUE WHEN NOT mine;
      CONTINUE WHEN done LIKE '%,' || attached.child || ',%';
      done := done || ',' || attached.child || ',';
      PERFORM set_config('wal2iceberg.attached', done, true);
      -- A partition created here is empty: its rows come as changes.
      CONTINUE WHEN tg_tag = 'CREATE TABLE';
      FOR target IN
        SELECT a.relid, n.nspname, r.relname
        FROM (SELECT attached.parent AS relid
              UNION SELECT relid FROM pg_partition_ancestors(attached.parent)) a
        JOIN pg_class r ON r.oid = a.relid
        JOIN pg_namespace n ON n.oid = r.relnamespace
        WHERE EXISTS (SELECT 1 FROM pg_publication p
                      JOIN pg_publication_tables t ON t.pubname = p.pubname
                      WHERE p.pubviaroot AND t.schemaname = n.nspname
                        AND t.tablename = r.relname)
      LOOP
        SELECT string_agg(format('%L, %I::text', attname, attname), ', ' ORDER BY attnum)
          INTO fields
          FROM pg_attribute
          WHERE attrelid = target.relid AND attnum > 0 AND NOT attisdropped
            AND attgenerated = '';
        EXECUTE format(
          'SELECT count(pg_logical_emit_message(true, %L, json_build_object(%L, %L, %L, %L, %L, json_build_object(%s))::text)) FROM %s',
          'wal2iceberg.attached_row', 'schema', target.nspname, 'table', target.relname,
          'row', fields, attached.child::regclass);
      END LOOP;
    END LOOP;
  END
  $fn$;
  COMMENT ON FUNCTION wal2iceberg.emit_attached_rows() IS 'created by wal2iceberg';
  IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'wal2iceberg_attached_rows') THEN
    CREATE EVENT TRIGGER wal2iceberg_attached_rows ON ddl_command_end
      WHEN TAG IN ('ALTER TABLE', 'CREATE TABLE')
      EXECUTE FUNCTION wal2iceberg.emit_attached_rows();
    COMMENT ON EVENT TRIGGER wal2iceberg_attached_rows IS 'created by wal2iceberg';
  END IF;
END
$$;
