"""The PostgreSQL adapter: schema migrations and the receipt store (schema `dlr`)."""

from dlrfeed.store.store import IngestResult, Store
from dlrfeed.store.submission import Submission, SubmissionResult
from dlrfeed.store.verification import Verification, VerificationResult

__all__ = [
    "IngestResult",
    "Store",
    "Submission",
    "SubmissionResult",
    "Verification",
    "VerificationResult",
]
