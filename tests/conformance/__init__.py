"""Conformance suite: the cases of other projects' own tests for the semantics cutegemm claims
(torch._grouped_mm, torch._scaled_mm / _scaled_grouped_mm, quack's fused linear epilogues),
rewritten against cutegemm's API with each source's tolerances. See README.md in this folder;
counts per source: ``python -m pytest tests/conformance -q -p no:randomly`` prints them at the
end (tests/conformance/conftest.py)."""
