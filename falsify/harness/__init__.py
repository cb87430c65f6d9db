"""Contract loading, validation, generation, the results ledger, coverage and audit."""
