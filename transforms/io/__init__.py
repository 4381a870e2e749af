"""Reading and writing files on any Beam filesystem: records, Parquet, atomic writes, heap settings."""
