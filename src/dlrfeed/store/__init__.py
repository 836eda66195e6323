"""The PostgreSQL adapter: schema migrations and the receipt store (schema `dlr`)."""

from dlrfeed.store.store import IngestResult, Store
from dlrfeed.store.submission import Submission, SubmissionResult

__all__ = ["IngestResult", "Store", "Submission", "SubmissionResult"]
