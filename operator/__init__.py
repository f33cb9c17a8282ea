"""rlsched.operator (see the README)."""
