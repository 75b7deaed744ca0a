"""The wire contract shared by the gateway and its clients: ticket encodings.

It lives in the client package because the client must not depend on the server, while
the server may depend on this small, dependency-light module (pyarrow-free, protobuf only).
"""

from thalweg_client.wire.tickets import WireError, decode_ticket, encode_ticket, is_json_ticket

__all__ = ["WireError", "decode_ticket", "encode_ticket", "is_json_ticket"]
