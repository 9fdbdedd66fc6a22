-- 004: rows of a partitioned table published via its root that change
-- in ways the WAL does not tell:
-- - the rows a table already holds when it is attached as a partition
--   were written as the standalone table's;
-- - a TRUNCATE of a partition alone is not published
--   (publish_via_partition_root, CREATE PUBLICATION);
-- - an update that moves a row to another partition is decoded as a
--   delete and an insert, like a delete and an insert the user made.
-- Triggers write them into the same transaction as transactional logical
-- messages (pg_logical_emit_message), one per row: prefix
-- wal2iceberg.attached_row with the row, wal2iceberg.truncated_row and
-- wal2iceberg.moving_row with its key, as {"schema", "table", "row":
-- {column: text}} of the published table, so that wal2iceberg applies them
-- at their exact place in the stream. The event trigger
-- wal2iceberg_partition_rows sends attached rows and puts the TRUNCATE
-- triggers on every new partition; wal2iceberg.watch_partitions(root) puts
-- the triggers on a tree's existing tables (wal2iceberg setup and run call
-- it).
--
-- An event trigger needs a superuser: run as another role, this file only
-- says so (wal2iceberg then refuses partitioned tables, naming this file).
-- Idempotent. `wal2iceberg teardown` leaves it, since other runs may rely on
-- it; DROP EVENT TRIGGER wal2iceberg_partition_rows; DROP SCHEMA wal2iceberg
-- CASCADE; removes it. The functions run as their owner, read only
-- catalogs and the partition concerned, and write only the messages and
-- the triggers.

DO $$
BEGIN
  IF NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
    RAISE NOTICE 'not a superuser: the triggers of wal2iceberg_partition_rows are not installed';
    RETURN;
  END IF;
  CREATE SCHEMA IF NOT EXISTS wal2iceberg;
  COMMENT ON SCHEMA wal2iceberg IS 'created by wal2iceberg';

  -- The tables that publish `rel`'s rows as theirs: its ancestors (itself
  -- included) that a publication publishes via the root.
  CREATE OR REPLACE FUNCTION wal2iceberg.publishing_roots(rel regclass)
  RETURNS TABLE (relid oid, nspname text, relname text)
  LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT a.relid, n.nspname::text, r.relname::text
    FROM pg_partition_ancestors(rel) a
    JOIN pg_class r ON r.oid = a.relid
    JOIN pg_namespace n ON n.oid = r.relnamespace
    WHERE EXISTS (SELECT 1 FROM pg_publication p
                  JOIN pg_publication_tables t ON t.pubname = p.pubname
                  WHERE p.pubviaroot AND t.schemaname = n.nspname AND t.tablename = r.relname)
  $fn$;

  -- One message per row of `source`, the `columns` of `target` (the table
  -- publishing it) as their text.
  CREATE OR REPLACE FUNCTION wal2iceberg.emit_rows(prefix text, target oid, source regclass, columns text[])
  RETURNS void
  LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
  DECLARE
    fields text;
  BEGIN
    SELECT string_agg(format('%L, %I::text', c, c), ', ') INTO fields FROM unnest(columns) c;
    EXECUTE format(
      'SELECT count(pg_logical_emit_message(true, %L, json_build_object(%L, %L, %L, %L, %L, json_build_object(%s))::text)) FROM %s',
      prefix, 'schema', (SELECT nspname FROM pg_namespace n JOIN pg_class c ON c.relnamespace = n.oid WHERE c.oid = target),
      'table', (SELECT relname FROM pg_class WHERE oid = target), 'row', fields, source);
  END
  $fn$;

  -- The triggers write their messages inside a subtransaction, so that a
  -- failure never fails the user's command. The server queues a message at
  -- the end of its WAL record, where the next record begins: a change the
  -- enclosing transaction makes next ties with the last message, and may be
  -- decoded before it. A message of the enclosing transaction after the
  -- subtransaction keeps every later change after the trigger's messages.
  CREATE OR REPLACE FUNCTION wal2iceberg.fence() RETURNS void
  LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT pg_logical_emit_message(true, 'wal2iceberg.fence', '')
  $fn$;

  -- A table's columns as pgoutput sends them, in order; `key_only` keeps
  -- those of its primary key, when it has one.
  CREATE OR REPLACE FUNCTION wal2iceberg.published_columns(rel oid, key_only boolean)
  RETURNS text[]
  LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT array_agg(a.attname::text ORDER BY a.attnum)
    FROM pg_attribute a
    WHERE a.attrelid = rel AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
      AND (NOT key_only
           OR NOT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = rel AND i.indisprimary)
           OR a.attnum = ANY ((SELECT i.indkey FROM pg_index i WHERE i.indrelid = rel AND i.indisprimary)::int2[]))
  $fn$;

  -- A trigger that failed must not fail the user's command: it says so in
  -- the session and in the stream (prefix wal2iceberg.partition_rows_failed),
  -- where wal2iceberg logs it as an error naming the table to reload.
  CREATE OR REPLACE FUNCTION wal2iceberg.report_failure(rel regclass, what text, error text)
  RETURNS void
  LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
  BEGIN
    RAISE WARNING 'wal2iceberg: the % of % were not sent to the lake: %', what, rel, error;
    PERFORM pg_logical_emit_message(true, 'wal2iceberg.partition_rows_failed',
      json_build_object('table', rel::text, 'what', what, 'error', error)::text);
  END
  $fn$;

  -- Before a TRUNCATE of a partition: the keys of its rows, as deletes of
  -- the table publishing it. A TRUNCATE of that table itself is published:
  -- its own trigger marks it for the statement, and its partitions' send
  -- nothing.
  CREATE OR REPLACE FUNCTION wal2iceberg.emit_truncated_rows() RETURNS trigger
  LANGUAGE plpgsql SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
  AS $fn$
  DECLARE
    truncating text := coalesce(current_setting('wal2iceberg.truncating', true), '');
    target record;
  BEGIN
    IF TG_WHEN = 'AFTER' THEN
      PERFORM set_config('wal2iceberg.truncating', '', true);
      RETURN NULL;
    END IF;
    BEGIN
      FOR target IN SELECT * FROM wal2iceberg.publishing_roots(TG_RELID) LOOP
        IF target.relid = TG_RELID THEN
          truncating := truncating || ',' || TG_RELID || ',';
          PERFORM set_config('wal2iceberg.truncating', truncating, true);
          CONTINUE;
        END IF;
        CONTINUE WHEN truncating LIKE '%,' || target.relid || ',%';
        -- A partitioned partition holds no rows: its partitions' triggers fire.
        CONTINUE WHEN (SELECT relkind FROM pg_class WHERE oid = TG_RELID) <> 'r';
        PERFORM wal2iceberg.emit_rows('wal2iceberg.truncated_row', target.relid, TG_RELID::regclass,
                                      wal2iceberg.published_columns(target.relid, true));
      END LOOP;
    EXCEPTION WHEN OTHERS THEN
      PERFORM wal2iceberg.report_failure(TG_RELID::regclass, 'truncated rows', SQLERRM);
    END;
    PERFORM wal2iceberg.fence();
    RETURN NULL;
  END
  $fn$;

  -- Before an update of a partition key column: the row's key, so that
  -- the delete and the insert the server sends when the row moves to
  -- another partition read as the one update they are. Should this fail,
  -- the move reads as a delete and an insert, which loses nothing.
  CREATE OR REPLACE FUNCTION wal2iceberg.emit_moving_row() RETURNS trigger
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
  DECLARE
    target record;
    fields text;
    message text;
  BEGIN
    BEGIN
      FOR target IN SELECT * FROM wal2iceberg.publishing_roots(TG_RELID) LOOP
        SELECT string_agg(format('%L, ($1).%I::text', c, c), ', ') INTO fields
        FROM unnest(wal2iceberg.published_columns(target.relid, true)) c;
        EXECUTE format('SELECT json_build_object(%L, %L, %L, %L, %L, json_build_object(%s))::text',
                       'schema', target.nspname, 'table', target.relname, 'row', fields)
          INTO message USING OLD;
        PERFORM pg_logical_emit_message(true, 'wal2iceberg.moving_row', message);
      END LOOP;
    EXCEPTION WHEN OTHERS THEN
      RAISE WARNING 'wal2iceberg: a row moving out of % will read as a delete and an insert: %',
        TG_RELID::regclass, SQLERRM;
    END;
    PERFORM wal2iceberg.fence();
    RETURN NEW;
  END
  $fn$;

  -- The session settings under which a value's text is what pgoutput
  -- sends for it: those of wal2iceberg's own connections.
  ALTER FUNCTION wal2iceberg.emit_rows(text, oid, regclass, text[])
    SET DateStyle = 'ISO' SET TimeZone = 'UTC' SET IntervalStyle = 'iso_8601'
    SET extra_float_digits = 3 SET bytea_output = 'hex';
  ALTER FUNCTION wal2iceberg.emit_moving_row()
    SET DateStyle = 'ISO' SET TimeZone = 'UTC' SET IntervalStyle = 'iso_8601'
    SET extra_float_digits = 3 SET bytea_output = 'hex';

  -- The columns of the partition keys at every level of `root`'s tree,
  -- named as the root names them; those an expression key reads included.
  CREATE OR REPLACE FUNCTION wal2iceberg.partition_columns(root regclass) RETURNS text[]
  LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT array_agg(DISTINCT a.attname::text ORDER BY a.attname::text)
    FROM pg_partition_tree(root) t
    JOIN pg_partitioned_table p ON p.partrelid = t.relid
    CROSS JOIN LATERAL (SELECT unnest(p.partattrs::int2[]) AS attnum
                        UNION
                        SELECT m[1]::int2 FROM regexp_matches(coalesce(p.partexprs::text, ''),
                                                              ':varattno (\d+)', 'g') m) k
    JOIN pg_attribute a ON a.attrelid = t.relid AND a.attnum = k.attnum
    WHERE k.attnum > 0
  $fn$;

  -- Puts the triggers on every table of `root`'s partition tree that lacks
  -- them: the TRUNCATE ones on each table, the moving-row one on the root
  -- (the server clones it to every partition, present and future), again
  -- when a new level of partitioning brought more key columns.
  CREATE OR REPLACE FUNCTION wal2iceberg.watch_partitions(root regclass) RETURNS void
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
  DECLARE
    rel regclass;
    keys text[] := wal2iceberg.partition_columns(root);
    moving oid;
  BEGIN
    SELECT g.oid INTO moving FROM pg_trigger g
    WHERE g.tgrelid = root AND g.tgname = 'wal2iceberg_moving_rows';
    IF keys IS NOT NULL AND keys::text IS DISTINCT FROM obj_description(moving, 'pg_trigger') THEN
      IF moving IS NOT NULL THEN
        EXECUTE format('DROP TRIGGER wal2iceberg_moving_rows ON %s', root);
      END IF;
      EXECUTE format('CREATE TRIGGER wal2iceberg_moving_rows BEFORE UPDATE ON %s FOR EACH ROW '
                     'WHEN (ROW(%s) IS DISTINCT FROM ROW(%s)) EXECUTE FUNCTION wal2iceberg.emit_moving_row()',
                     root,
                     (SELECT string_agg(format('OLD.%I', k), ', ') FROM unnest(keys) k),
                     (SELECT string_agg(format('NEW.%I', k), ', ') FROM unnest(keys) k));
      EXECUTE format('COMMENT ON TRIGGER wal2iceberg_moving_rows ON %s IS %L', root, keys::text);
    END IF;
    -- Tables and partitioned tables: a foreign partition takes no trigger.
    FOR rel IN SELECT t.relid FROM pg_partition_tree(root) t
               JOIN pg_class c ON c.oid = t.relid AND c.relkind IN ('r', 'p')
               WHERE NOT EXISTS (SELECT 1 FROM pg_trigger g
                                 WHERE g.tgrelid = t.relid AND g.tgname = 'wal2iceberg_truncated_rows')
    LOOP
      EXECUTE format('CREATE TRIGGER wal2iceberg_truncated_rows BEFORE TRUNCATE ON %s '
                     'FOR EACH STATEMENT EXECUTE FUNCTION wal2iceberg.emit_truncated_rows()', rel);
    END LOOP;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = root AND tgname = 'wal2iceberg_truncated_end') THEN
      EXECUTE format('CREATE TRIGGER wal2iceberg_truncated_end AFTER TRUNCATE ON %s '
                     'FOR EACH STATEMENT EXECUTE FUNCTION wal2iceberg.emit_truncated_rows()', root);
    END IF;
  END
  $fn$;
  REVOKE ALL ON FUNCTION wal2iceberg.watch_partitions(regclass) FROM PUBLIC;

  -- After CREATE TABLE and ALTER TABLE: a partition this transaction
  -- attached sends its rows; every new partition gets the triggers.
  CREATE OR REPLACE FUNCTION wal2iceberg.emit_attached_rows() RETURNS event_trigger
  LANGUAGE plpgsql SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
  AS $fn$
  DECLARE
    top bigint := pg_current_xact_id()::text::bigint;
    -- Partitions this transaction created or already sent, as a list of oids.
    done text := coalesce(current_setting('wal2iceberg.attached', true), '');
    attached record;
    target record;
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
      BEGIN
        FOR target IN SELECT * FROM wal2iceberg.publishing_roots(attached.parent) LOOP
          PERFORM wal2iceberg.watch_partitions(target.relid::regclass);
          -- A partition created here is empty: its rows come as changes.
          CONTINUE WHEN tg_tag = 'CREATE TABLE';
          PERFORM wal2iceberg.emit_rows('wal2iceberg.attached_row', target.relid, attached.child::regclass,
                                        wal2iceberg.published_columns(target.relid, false));
        END LOOP;
      EXCEPTION WHEN OTHERS THEN
        PERFORM wal2iceberg.report_failure(attached.child::regclass, 'attached rows', SQLERRM);
      END;
      PERFORM wal2iceberg.fence();
    END LOOP;
  END
  $fn$;
  COMMENT ON FUNCTION wal2iceberg.emit_attached_rows() IS 'created by wal2iceberg';
  IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'wal2iceberg_partition_rows') THEN
    CREATE EVENT TRIGGER wal2iceberg_partition_rows ON ddl_command_end
      WHEN TAG IN ('ALTER TABLE', 'CREATE TABLE')
      EXECUTE FUNCTION wal2iceberg.emit_attached_rows();
    COMMENT ON EVENT TRIGGER wal2iceberg_partition_rows IS 'created by wal2iceberg';
  END IF;
END
$$;
