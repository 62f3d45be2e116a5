"""The local composition root: the runner and the embedded services behind `infra/up`, the tests and the benchmarks.

Nothing in the platform imports it; it imports the platform.
"""
