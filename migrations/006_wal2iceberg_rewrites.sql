-- 006: a mark in the stream where DDL rewrote a table's rows. ALTER
-- COLUMN ... TYPE (with or without USING), ADD COLUMN with a volatile
-- default and SET LOGGED rewrite every row in place, and pgoutput sends
-- no row change for it; the values may differ after. Before each rewrite,
-- the event trigger wal2iceberg_rewrites writes into the same transaction
-- a transactional logical message: prefix wal2iceberg.rewrite,
-- {"tables": [[schema, name, oid], ...], "reason": n}, the table rewritten
-- and each of its partition ancestors, and PostgreSQL's reason bits
-- (pg_event_trigger_table_rewrite_reason). A run reloads the silver table
-- of a captured table it names (docs/tables.md, Schema changes).
--
-- It also gives migration 005's message the table's OID and each
-- column's type: {"schema", "table", "oid", "columns": [[name, attnum,
-- has default, type oid, type modifier], ...]}, as a Relation message
-- names them, so that both tables follow each ALTER TABLE at its place in
-- the stream though no change of the table follows it.
--
-- An event trigger needs a superuser: run as another role, this file only
-- says so, and a rewrite with no change of type is not seen. Idempotent.
-- `wal2iceberg teardown` leaves it; DROP EVENT TRIGGER
-- wal2iceberg_rewrites; removes it. The function reads only the catalog
-- and writes only the message; a failure of its own lets the user's
-- command through, with a warning.

DO $$
BEGIN
  IF NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
    RAISE NOTICE 'not a superuser: the event trigger wal2iceberg_rewrites is not installed';
    RETURN;
  END IF;
  CREATE SCHEMA IF NOT EXISTS wal2iceberg;
  COMMENT ON SCHEMA wal2iceberg IS 'created by wal2iceberg';
  CREATE OR REPLACE FUNCTION wal2iceberg.emit_rewrite() RETURNS event_trigger
  LANGUAGE plpgsql SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
  AS $fn$
  BEGIN
    BEGIN
      PERFORM pg_logical_emit_message(true, 'wal2iceberg.rewrite', json_build_object(
        'tables', (SELECT coalesce(json_agg(json_build_array(n.nspname, r.relname, r.oid::int8)), '[]'::json)
                   FROM (SELECT pg_event_trigger_table_rewrite_oid() AS relid
                         UNION
                         SELECT relid FROM pg_partition_ancestors(pg_event_trigger_table_rewrite_oid())) a
                   JOIN pg_class r ON r.oid = a.relid
                   JOIN pg_namespace n ON n.oid = r.relnamespace),
        'reason', pg_event_trigger_table_rewrite_reason())::text);
    EXCEPTION WHEN OTHERS THEN
      RAISE WARNING 'wal2iceberg: cannot mark the rewrite of %: %',
        pg_event_trigger_table_rewrite_oid()::regclass, SQLERRM;
    END;
    -- As in migration 005: the guarded block is a subtransaction, whose
    -- message can be decoded after the next change; one of the enclosing
    -- transaction keeps it in place (docs/traps.md).
    PERFORM pg_logical_emit_message(true, 'wal2iceberg.fence', '');
  END
  $fn$;
  COMMENT ON FUNCTION wal2iceberg.emit_rewrite() IS 'created by wal2iceberg';
  CREATE OR REPLACE FUNCTION wal2iceberg.emit_columns() RETURNS event_trigger
  LANGUAGE plpgsql SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
  AS $fn$
  DECLARE
    target record;
  BEGIN
    FOR target IN
      SELECT DISTINCT r.oid, n.nspname, r.relname
      FROM pg_event_trigger_ddl_commands() c
      JOIN pg_class r ON r.oid = c.objid
      JOIN pg_namespace n ON n.oid = r.relnamespace
      WHERE c.classid = 'pg_class'::regclass AND r.relkind IN ('r', 'p')
    LOOP
      BEGIN
        PERFORM pg_logical_emit_message(true, 'wal2iceberg.columns', json_build_object(
          'schema', target.nspname,
          'table', target.relname,
          'oid', target.oid::int8,
          'columns', (SELECT coalesce(json_agg(json_build_array(a.attname, a.attnum,
                                                                 a.atthasdef OR a.atthasmissing,
                                                                 a.atttypid::int8, a.atttypmod)
                                               ORDER BY a.attnum), '[]'::json)
                      FROM pg_attribute a
                      WHERE a.attrelid = target.oid AND a.attnum > 0
                        AND NOT a.attisdropped AND a.attgenerated = ''))::text);
      EXCEPTION WHEN OTHERS THEN
        RAISE WARNING 'wal2iceberg: cannot send the column numbers of %.%: %',
          target.nspname, target.relname, SQLERRM;
      END;
      PERFORM pg_logical_emit_message(true, 'wal2iceberg.fence', '');
    END LOOP;
  END
  $fn$;
  COMMENT ON FUNCTION wal2iceberg.emit_columns() IS 'created by wal2iceberg';
  IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'wal2iceberg_rewrites') THEN
    CREATE EVENT TRIGGER wal2iceberg_rewrites ON table_rewrite
      EXECUTE FUNCTION wal2iceberg.emit_rewrite();
    COMMENT ON EVENT TRIGGER wal2iceberg_rewrites IS 'created by wal2iceberg';
  END IF;
END
$$;
