"""The falsify contract library: one YAML contract per kernel, the JSON Schema and FORMAT.md,
shipped as package data (located with importlib.resources by falsify.harness.project)."""
