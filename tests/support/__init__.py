"""What only the tests use: harnesses for fakegw and the webhook receiver, fixtures, the
hypothesis strategies of receipts, a frozen clock, a callback receiver, the schema reader and a
TCP proxy that cuts connections.
The tools the tests share with the benchmarks and the demo are in tools/dlrfeed_tools."""
