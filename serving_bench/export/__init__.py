"""Exporters (one module per framework) and the Triton model-repository writer."""
