"""The LMDB event log: append with group commit, read, follow, snapshots."""
