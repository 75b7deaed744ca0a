"""Topic administration, for the quickstart's demo data and nothing on the hot path.

The gateway itself never creates topics (a source's topics are the operator's); only
``twg quickstart`` makes its ``orders`` topic on the embedded broker.
"""

from __future__ import annotations

import contextlib

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError


async def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """Create ``topic`` with ``partitions`` partitions (replication 1); an existing topic
    is reused as it is."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        with contextlib.suppress(TopicAlreadyExistsError):  # a rerun reuses the topic
            await admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        await admin.close()
