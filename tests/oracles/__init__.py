"""Independent solvers and synthetic tables the plan-search tests and benchmarks check against.

Nothing in costmodel/ or dysejax/ imports this package.
"""
