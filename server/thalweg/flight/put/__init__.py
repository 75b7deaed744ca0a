"""The write verb: ``do_put`` into a topic.

``plan`` checks a put's schema against the topic before a row is produced and turns each
batch into produce columns; ``encoders`` builds the registry-backed payload encoders;
``producers`` gives both transports one acknowledgement shape; ``service`` holds the
verb's body, which the server only dispatches to.
"""
