"""Fuzz harnesses for refplan: hostile maps, plans, policy answers and CLI input.

``fuzz/run.py`` runs them (atheris when it is installed, a hypothesis-driven loop otherwise);
``tests/test_fuzz_smoke.py`` runs a bounded smoke of each; ``fuzz/README.md`` explains both.
"""
