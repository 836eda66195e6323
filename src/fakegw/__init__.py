"""fakegw: a faithful, adversarial fake of the gateway's receipt feed (spec/feed.md F1-F16).

It shares nothing with dlrfeed but the generated proto (package `gateway.receipts.v1`).
"""
