"""The ``twg`` command line.

Before anything imports pyarrow: Arrow's buffers come from jemalloc unless
``ARROW_DEFAULT_MEMORY_POOL`` names another allocator. The gateway allocates and frees
Arrow buffers at a high rate, and allocators differ in how much freed memory they keep:
with a 1 M-record backlog, RSS grew +410 MiB over a 256 MiB ``max_buffered_bytes`` with
jemalloc against +567 MiB with pyarrow's default (mimalloc), and +86 against +209 MiB
over a 32 MiB bound; jemalloc ingested a little faster too (docs/performance.md). The
variable is read once, when Arrow first allocates, so it is set here rather than from
the config file; a pyarrow build without jemalloc falls back to its default by itself.
"""

import os

os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")
