"""A table's contract tags as its AWS Glue resource tags (ADR 0042): what IAM
tag-based access control and Lake Formation's tag policies read, beside the
``thalweg.tag.*`` table properties every catalog gets."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def tag(catalog: Any, ident: str, tags: dict[str, str]) -> None:
    """Tag the Glue table ``ident`` (``database.table``) with ``tags``. A refusal (no
    ``glue:TagResource`` permission) is logged, not a failed flush: the properties
    carry the same tags, and the next sync of the table's docs tries again."""
    glue = catalog.glue  # pyiceberg's GlueCatalog keeps its boto3 client here
    database, _, name = ident.rpartition(".")
    try:
        account = glue.get_table(DatabaseName=database, Name=name)["Table"]["CatalogId"]
        region = glue.meta.region_name
        arn = f"arn:aws:glue:{region}:{account}:table/{database}/{name}"
        glue.tag_resource(ResourceArn=arn, TagsToAdd=tags)
    except Exception as exc:  # botocore's errors; the table's properties hold the tags
        log.warning("glue table %s: its tags were not set: %s", ident, exc)
