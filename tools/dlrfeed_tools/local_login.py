"""The gateway login of the local tools: `make run`, the benchmarks and their fake gateway.

One throwaway login on loopback, nothing to protect; tests keep their own (the daemon harness's
distinctive password is what leak tests search for).
"""

LOGIN = "demo"
PASSWORD = "demo-secret"
