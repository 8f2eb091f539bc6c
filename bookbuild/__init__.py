"""Build tooling of the book: papermill runner, cache, normalisation, site checks."""
