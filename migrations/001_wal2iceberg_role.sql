-- A least-privilege role for wal2iceberg. Run once per database, as a
-- superuser or the owner of the replicated tables. wal2iceberg never runs
-- this itself: it only checks (wal2iceberg check) that these rights exist.
--
-- REPLICATION lets the role open replication connections and create slots.
-- SELECT is needed for the initial load. Creating the publication needs
-- ownership of the tables; the owner can instead create it once:
--   CREATE PUBLICATION wal2iceberg FOR TABLE public.customers;
-- and wal2iceberg will use it as it is (or add tables it lacks, if allowed).

DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'wal2iceberg') THEN
    CREATE ROLE wal2iceberg LOGIN REPLICATION PASSWORD 'change-me';
  END IF;
END
$$;

GRANT USAGE ON SCHEMA public TO wal2iceberg;
GRANT SELECT ON ALL TABLES IN SCHEMA public TO wal2iceberg;
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO wal2iceberg;
