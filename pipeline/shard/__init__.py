"""The shard job: Beam wiring and manifest assembly."""
