"""``bspec bench``: speculative against plain decoding on real servers.

- ``workloads.py``: the prompts (code edits, rewrites, JSON, free-form);
- ``runner.py``: interleaved plain/speculative runs, medians and ratios;
- ``divergence.py``: where two texts part, and whether it was a near-tie;
- ``report.py``: terminal table, JSON file, PNG plots.
"""
