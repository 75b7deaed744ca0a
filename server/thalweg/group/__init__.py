"""What the consumer group shares between its gateways: the partition → owner map that
the Kafka assignor publishes and the read side routes by."""
