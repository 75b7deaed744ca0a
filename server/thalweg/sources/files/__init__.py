"""Files as a bounded source for ``twg batch``: readers per format, the manifest that
makes a run resumable, and the source that feeds the stream's own engine."""
