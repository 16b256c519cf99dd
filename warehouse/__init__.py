"""The only code that talks to DuckDB: record schemas, loading a run, and named queries from sql/."""
