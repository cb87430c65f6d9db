"""Conformance: the shipped contracts judged against third-party libraries that implement the
same math (`falsify conformance`). registry: the binding sets, one adapter module per library
(lib_<name>.py); plan: which checks judge a binding and how bindings share pytest sessions.
The ledger, its cells and the matrix are falsify.harness.conformance (the docs pages read it)."""
