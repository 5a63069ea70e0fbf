"""graphlint rules: one module per rule, each a `graphlint.rule.Rule` subclass with its docs and examples."""
