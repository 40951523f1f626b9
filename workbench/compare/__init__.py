"""Comparison: metrics between a reference and a candidate (the op-by-op report grows here)."""
