"""Keeping the lanes within bounds: retention floors, compaction merges, and the ballast
that lets a floor rise on a full disk."""
