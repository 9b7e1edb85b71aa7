"""Helpers for tests: a numpy backend and tiny random BERT checkpoints. No ML framework is imported."""
