"""Flight SQL on the gateway: SQL over the lanes for ADBC, JDBC and every Flight SQL client.

``messages`` decodes the protocol's ``Any``-packed commands, ``metadata`` answers the
catalog commands, ``tables`` turns lanes into DataFusion tables, ``engine`` plans and
runs queries, ``service`` maps the Flight verbs onto them (docs/flight-sql.md).
"""
