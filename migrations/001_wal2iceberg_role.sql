-- 001: the least-privilege role wal2iceberg runs as. Idempotent.
--
-- REPLICATION lets it open replication connections and create its slot.
-- It gets SELECT only on the tables it replicates (wal2iceberg setup grants
-- it per table; by hand: GRANT SELECT ON public.customers TO wal2iceberg;).
-- No password is set here: give it one yourself, e.g. in psql
--   \password wal2iceberg
-- or let it log in another way your pg_hba.conf allows.

DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'wal2iceberg') THEN
    CREATE ROLE wal2iceberg LOGIN REPLICATION;
  END IF;
END
$$;
