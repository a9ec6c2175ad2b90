"""Integrations with other frameworks: a Gymnasium plugin, an inspect_ai task, a verifiers environment.

`gym_plugin` needs only the core dependencies; `inspect_eval` needs the `ncpbench[inspect]` extra,
`verifiers_env` the `ncpbench[verifiers]` extra. See docs/INTEGRATIONS.md.
"""
