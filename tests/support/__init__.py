"""Helpers shared by the test tiers (not test modules): paths, the cluster fixtures, the TensorRT-LLM facts.

Test modules import from here or use the fixtures of tests/conftest.py; they never import each other.
"""
