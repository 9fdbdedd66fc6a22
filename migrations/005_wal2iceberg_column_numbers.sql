-- 005: each table's column numbers at the exact place of the DDL that set
-- them. A Relation message names a table's columns but not their numbers
-- (pg_attribute.attnum), which tell a rename (the number stays) from a
-- drop and an add (a new number); read from the catalog when the message
-- is decoded, they may already belong to later DDL. After each ALTER
-- TABLE, the event trigger wal2iceberg_columns writes the table's columns
-- into the same transaction as a transactional logical message: prefix
-- wal2iceberg.columns, {"schema", "table", "columns": [[name, attnum,
-- has default], ...]} in the order pgoutput sends them; "has default" is
-- atthasdef or atthasmissing: the rows before an added column hold a
-- value (docs/tables.md, Schema changes).
--
-- An event trigger needs a superuser: run as another role, this file only
-- says so, and renames are told by the catalog alone. Idempotent. `wal2iceberg teardown` leaves
-- it; DROP EVENT TRIGGER wal2iceberg_columns; removes it. The function
-- reads only pg_attribute and writes only the message; a failure of its
-- own lets the user's command through, with a warning.

DO $$
BEGIN
  IF NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
    RAISE NOTICE 'not a superuser: the event trigger wal2iceberg_columns is not installed';
    RETURN;
  END IF;
  CREATE SCHEMA IF NOT EXISTS wal2iceberg;
  COMMENT ON SCHEMA wal2iceberg IS 'created by wal2iceberg';
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
          'columns', (SELECT coalesce(json_agg(json_build_array(a.attname, a.attnum,
                                                                 a.atthasdef OR a.atthasmissing)
                                               ORDER BY a.attnum), '[]'::json)
                      FROM pg_attribute a
                      WHERE a.attrelid = target.oid AND a.attnum > 0
                        AND NOT a.attisdropped AND a.attgenerated = ''))::text);
      EXCEPTION WHEN OTHERS THEN
        RAISE WARNING 'wal2iceberg: cannot send the column numbers of %.%: %',
          target.nspname, target.relname, SQLERRM;
      END;
      -- The guarded block is a subtransaction, whose message can be
      -- decoded after the next change; one of the enclosing transaction
      -- keeps it in place (docs/traps.md), as migration 004's fence does.
      PERFORM pg_logical_emit_message(true, 'wal2iceberg.fence', '');
    END LOOP;
  END
  $fn$;
  COMMENT ON FUNCTION wal2iceberg.emit_columns() IS 'created by wal2iceberg';
  IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'wal2iceberg_columns') THEN
    CREATE EVENT TRIGGER wal2iceberg_columns ON ddl_command_end
      WHEN TAG IN ('ALTER TABLE')
      EXECUTE FUNCTION wal2iceberg.emit_columns();
    COMMENT ON EVENT TRIGGER wal2iceberg_columns IS 'created by wal2iceberg';
  END IF;
END
$$;
