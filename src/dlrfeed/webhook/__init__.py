"""`dlrfeed webhook`: receipts by HTTP callback, in the gateway's, Jasmin's or Kannel's format."""
