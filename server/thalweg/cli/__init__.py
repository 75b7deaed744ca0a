"""The ``twg`` command line."""
