"""dlrfeed: drains an SMS gateway's delivery-receipt feed into PostgreSQL.

Layers, one direction of dependency:
- `dlrfeed.domain`: pure receipt parsing and the status state machine (no I/O);
- `dlrfeed.store`: the PostgreSQL adapter (schema, migrations, idempotent batch ingest);
- `dlrfeed.feed`: the gRPC adapter (Subscribe/Pull readers, the Acker);
- `dlrfeed.daemon`: the composition root that wires them into `dlrfeed run`.
"""

__version__ = "0.1.0"
