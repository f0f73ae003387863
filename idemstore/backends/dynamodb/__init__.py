"""``dynamodb://TABLE?region=…&endpoint_url=…``: one item per record in a DynamoDB table.

Every operation is one request: ``reserve`` a conditional ``UpdateItem`` that continues the
fence, ``complete``/``release``/``extend`` an ``UpdateItem`` conditioned on token and fence,
``get`` a consistent ``GetItem``. Times come from the client's clock with a ``clock_skew``
margin. See docs/backends/dynamodb.md.

Modules: ``store`` (the store), ``items`` (attributes, expressions, decoding), ``table`` (the
table for ``idemstore migrate``), ``client_errors`` (botocore's errors mapped), ``options``
(its options table).
"""

from __future__ import annotations

from idemstore.backends.dynamodb.items import partition_key
from idemstore.backends.dynamodb.store import DynamoDBStore

__all__ = ["DynamoDBStore", "partition_key"]
