"""rlsched.extender (see the README)."""
