"""Each chapter's experiments: one module per folder of chapters/ (framework, rank_gap, head_count,
trained_heads, gradient_highway).

The sweeps, probes, witnesses, constructions, training set-ups and report rows that serve one
chapter's notebooks. A module imports `lib` (and `reference`); `lib` never imports this package,
and nothing here is part of lib's API. A function two chapters need belongs in `lib`.
"""
