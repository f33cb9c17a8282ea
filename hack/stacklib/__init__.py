"""The parts of the local stack, one concern per module; ``hack/rlstack.py`` puts them together (and
re-exports them: callers import ``rlstack``)."""
